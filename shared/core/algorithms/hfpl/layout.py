"""HFPL's records (the package's docstring has their table): the names of their groups and tensors, the names the
served model keeps, and what an edge keeps of each client and the cloud of each edge."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from fl_services.shared.core.algorithms.prototypes import ClientPrototypes, EdgePrototypes

__all__ = [
    "ACCURACY", "BIAS", "CLIENTS", "COUNTS", "EDGES", "EVALUATION", "EVAL_METRICS", "EXTRACTOR", "FEATURES", "HEAD",
    "HIDDEN_WEIGHT", "LABELS", "MEANS", "PROTOTYPES", "PROTO_ACCURACY", "SAMPLE", "SERVED", "SERVED_HEAD", "TEST_LOSS",
    "WEIGHT", "ClientMemory", "EdgeMemory", "Sample",
]

# Groups
PROTOTYPES, HEAD, SAMPLE, EXTRACTOR = "prototypes", "classifier", "sample", "extractor"  # HEAD: G
CLIENTS, EDGES, EVALUATION = "clients", "edges", "evaluation"
# Tensors within them
MEANS, COUNTS, WEIGHT, BIAS, FEATURES, LABELS = "means", "counts", "weight", "bias", "features", "labels"
HIDDEN_WEIGHT = "hidden.weight"  # the mlp G's first layer (see MLPClassifier)
# The served model's names (GET /runs/{id}/model), flat as the REST API's readers expect them: C̄ under
# these, and G's state dict under "classifier." (classifier.weight, classifier.bias for the linear G).
SERVED = {"prototypes": (PROTOTYPES, MEANS), "prototype_counts": (PROTOTYPES, COUNTS)}
SERVED_HEAD = f"{HEAD}."
# What each client reports with its result; the cloud keeps every client's latest in "evaluation"
# (one value per client, NaN until it reports).
ACCURACY, PROTO_ACCURACY, TEST_LOSS = "accuracy", "proto_accuracy", "test_loss"
EVAL_METRICS = (ACCURACY, PROTO_ACCURACY, TEST_LOSS)




@dataclass(frozen=True)
class Sample:
    """Features with their labels: X_i of a client, X^l of an edge."""

    features: torch.Tensor  # (n, d) float32
    labels: torch.Tensor  # (n,) int64


@dataclass(frozen=True)
class ClientMemory(Sample, ClientPrototypes):
    """What an edge keeps of client i (packed by id): c_i^{prev} (means, classes it ever had) and X_i^{l,edge}."""


@dataclass(frozen=True)
class EdgeMemory(Sample, EdgePrototypes):
    """What the cloud keeps of edge l (packed by id): (C^{l,prev}, N^{l,prev}) and X^{l,cloud}."""
