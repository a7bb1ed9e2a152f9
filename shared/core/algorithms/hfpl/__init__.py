"""Hierarchical Federated Prototype Learning, the asynchronous baseline (seeds/003).

Clients keep their own feature extractors f_i: x → R^d, of different architectures (families); only
class prototypes, counts and a sample of features travel. Edges aggregate prototypes incrementally;
the cloud consumes a buffer of B edge triples (C^l, N^l, X^l), updates the global prototypes C̄ and
trains a global classifier G (linear by default) on the union of the latest features of every edge.

Records (group: tensors; J classes, d = feature_dim):
    global / task   prototypes: means (J, d) f64, counts (J,) f64 · classifier: G's state dict: weight (J, d),
                    bias (J,); the mlp G's output layer is weight (J, h), bias (J,), its hidden layer
                    hidden.weight (h, d), hidden.bias (h,)
    client result   prototypes: means (J, d) f64, counts (J,) i64 (its samples per class)
                    sample: features (n, d), labels (n,) i64
    edge triple     prototypes: means (J, d) f64, counts (J,) f64 (clients per class) · sample: as a result's
    client state    extractor: f_i's state dict
    edge state      prototypes: (C^l, N^l) · clients: a ClientMemory per client, packed by id
    cloud state     edges: an EdgeMemory per edge, packed by id · evaluation: each client's latest figures (N,)
The model the REST API serves is flat: prototypes, prototype_counts, classifier.weight, classifier.bias (and
classifier.hidden.weight, classifier.hidden.bias for the mlp G).

Modules: algorithm (the HFPL hooks), params (HFPLParams), layout (record names, what edges and the cloud keep),
modules (the cosine and mlp kinds of G), classifier (G made, loaded, trained), evaluation (a client's held-out
figures), baseline (the local-only baseline it is measured against).
"""
from __future__ import annotations

from fl_services.shared.core.algorithms.hfpl import layout
from fl_services.shared.core.algorithms.hfpl.algorithm import HFPL
from fl_services.shared.core.algorithms.hfpl.baseline import train_alone
from fl_services.shared.core.algorithms.hfpl.layout import *  # noqa: F403 (its __all__: the records' names)
from fl_services.shared.core.algorithms.hfpl.modules import CosineClassifier, MLPClassifier
from fl_services.shared.core.algorithms.hfpl.params import HFPLParams

__all__ = ["HFPL", "CosineClassifier", "HFPLParams", "MLPClassifier", "train_alone"]
__all__ += layout.__all__
