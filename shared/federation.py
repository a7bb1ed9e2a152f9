"""What the services and the reference runner must agree on to produce the same model.

Client selection, each client's RNG, the initial model and the global evaluation are defined here
once; the edge, the client, the cloud and `shared.reference` all call these functions.
"""
from __future__ import annotations

import math
from functools import partial

from torch import nn

from shared.algorithms.base import Algorithm, LocalJob
from shared.config import RunConfig
from shared.data.datasets import ClientData, load_federated
from shared.models import build_model
from shared.seeding import LOCAL_TRAINING, MODEL_INIT, SELECTION, derive_seed, numpy_generator, torch_generator
from shared.training import Evaluation, evaluate, load_parameters


def num_selected(fraction: float, num_clients: int) -> int:
    """m = max(floor(λ·N), 1)."""
    return max(math.floor(fraction * num_clients + 1e-9), 1)


def select_clients(config: RunConfig, client_ids: list[int], round: int, edge_id: int) -> list[int]:
    """The m clients an edge trains in `round`, drawn from a generator owned by (seed, round, edge)."""
    pool = sorted(client_ids)
    m = num_selected(config.fraction, len(pool))
    rng = numpy_generator(config.seed, SELECTION, round, edge_id)
    return sorted(pool[i] for i in rng.choice(len(pool), size=m, replace=False))


def model_factory(config: RunConfig) -> partial[nn.Module]:
    data = load_federated(config.data, config.seed)
    return partial(build_model, config.model, data.input_shape, data.num_classes)


def initial_model(config: RunConfig) -> nn.Module:
    return model_factory(config)(seed=derive_seed(config.seed, MODEL_INIT))


def local_job(config: RunConfig, client_id: int, round: int, data: ClientData) -> LocalJob:
    return LocalJob(
        client_id=client_id,
        round=round,
        data=data,
        model_factory=model_factory(config),
        generator=torch_generator(config.seed, LOCAL_TRAINING, round, client_id),
    )


def evaluate_global(config: RunConfig, algorithm: Algorithm, global_) -> Evaluation:
    data = load_federated(config.data, config.seed)
    model = load_parameters(initial_model(config), algorithm.model_parameters(global_))
    return evaluate(model, data.test)
