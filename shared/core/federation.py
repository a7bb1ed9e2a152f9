"""What the services and the reference runner must agree on to produce the same model.

The initial model, the round index and RNG of each client's local update, the hooks' view of an edge's
contribution and of its clients' participation, and the global evaluation are defined here once; the
edge, the client, the cloud and `fl_services.shared.core.reference` all call these functions (client selection is
shared/core/selection.py; the rounds themselves are shared/core/edge_round.py and shared/core/cloud_round.py).
"""
from __future__ import annotations

import math
from collections.abc import Iterable
from functools import partial
from pathlib import Path

import torch
from torch import nn

from fl_services.shared.core.algorithms.base import Algorithm, ClientResult, Contribution, LocalJob
from fl_services.shared.core.config import RunConfig, is_import_path
from fl_services.shared.core.data import ClientData, RunTask, load_federated
from fl_services.shared.core.device import CPU, computing_on, current, dataset_to, record_to
from fl_services.shared.core.models import build_model
from fl_services.shared.core.records import Record
from fl_services.shared.core.reports import (
    ClientParticipation,
    EdgeContributionHeader,
    FederatedEvaluation,
    HeldOut,
    SiteHeldOut,
)
from fl_services.shared.core.seeding import LOCAL_TRAINING, MODEL_INIT, derive_seed, torch_generator
from fl_services.shared.core.training import Evaluation, evaluate, load_parameters


def model_factory(config: RunConfig) -> partial[nn.Module]:
    data = load_federated(config.data, config.seed)
    return partial(build_model, config.model, data.input_shape, data.num_classes)


def run_task(config: RunConfig) -> RunTask:
    """What the run's model takes and predicts, which a device's own data must fit: derived from the run's data
    set, as the model's shape is."""
    data = load_federated(config.data, config.seed)
    return RunTask(input_shape=data.input_shape, num_classes=data.num_classes)


def known_num_samples(config: RunConfig) -> list[int] | None:
    """Every client's training sample count, what its results must claim (a client reports the size of its
    training split), where an edge can derive it from the config and seed alone: the built-in data sets,
    and an npz file (a `file` partition's client index) readable at the config's path. None for an
    imported loader, whose code the edge does not run, or an npz file the edge does not hold."""
    data = config.data
    if is_import_path(data.dataset) or (data.dataset == "npz" and not (data.path and Path(data.path).is_file())):
        return None
    return [len(client.train) for client in load_federated(data, config.seed).clients]


def initial_model(config: RunConfig) -> nn.Module:
    return model_factory(config)(seed=derive_seed(config.seed, MODEL_INIT))


def client_round(config: RunConfig, version: int, edge_round: int) -> int:
    """The round index clients see: global version v, edge round e of κ → v·κ + e (κ = 1: just v)."""
    return version * config.topology.edge_rounds + edge_round


def local_job(config: RunConfig, client_id: int, round: int, data: ClientData) -> LocalJob:
    return LocalJob(
        client_id=client_id,
        round=round,
        data=data,
        model_factory=model_factory(config),
        generator=torch_generator(config.seed, LOCAL_TRAINING, round, client_id),
    )


def contribution(config: RunConfig, header: EdgeContributionHeader, tensors: Record) -> Contribution:
    """An accepted edge message as the cloud's update sees it: with its declared members in a run over registered
    devices (a simulated run's are its roster, as in the reference runner)."""
    members = tuple(header.members) if config.selection is not None and header.members is not None else None
    return Contribution(header.edge_id, header.base_version, tensors, header.weight, tuple(header.clients),
                        tuple(header.failures), members, header.evaluation)


def participation(results: list[ClientResult]) -> list[ClientParticipation]:
    return [ClientParticipation(client_id=r.client_id, num_samples=r.num_samples, loss=r.loss, metrics=r.metrics,
                                device=r.device, evaluation=r.evaluation)
            for r in sorted(results, key=lambda r: r.client_id)]


# ---- federated evaluation (RunConfig.evaluation "federated", "both") ---------------------------------------
def cloud_evaluates(config: RunConfig) -> bool:
    """Whether the cloud evaluates each version on the test set it loads (the history's test_loss, test_accuracy)."""
    return config.evaluation != "federated"


def device_evaluates(config: RunConfig, round: int) -> bool:
    """Whether a device evaluates the model of its task for client round `round`: in a run with federated
    evaluation, in the first edge round of each version, whose task carries the global model (the later ones of
    κ > 1 carry the edge's own)."""
    return config.evaluation != "cloud" and round % config.topology.edge_rounds == 0


def evaluate_held_out(algorithm: Algorithm, job: LocalJob, task: Record,
                      device: torch.device = CPU) -> HeldOut | None:
    """The device's evaluation of the global model its task carries (the task's version, before it trains on it)
    on its held-out split, computed on `device`; None where it evaluates nothing (not this round, or no held-out
    samples)."""
    if not device_evaluates(algorithm.config, job.round) or len(job.data.test) == 0:
        return None
    with computing_on(device):
        # Built on the CPU and moved, as for training: the same weights wherever it runs.
        model = load_parameters(job.model_factory().to(device), algorithm.model_parameters(record_to(task, device)))
        figures = evaluate(model, dataset_to(job.data.test, device))
    return HeldOut(loss=figures.loss, accuracy=figures.accuracy, num_samples=figures.samples)


def held_out_mean(figures: Iterable[HeldOut]) -> HeldOut | None:
    """The sample-weighted mean of evaluations on held-out splits (a site's of its devices', a version's of its
    sites'); None for none."""
    items = list(figures)
    total = sum(f.num_samples for f in items)
    if not total:
        return None
    return HeldOut(loss=math.fsum(f.loss * f.num_samples for f in items) / total,
                   accuracy=min(1.0, math.fsum(f.accuracy * f.num_samples for f in items) / total),
                   num_samples=total)


def site_evaluation(clients: Iterable[ClientParticipation]) -> HeldOut | None:
    """An edge's evaluation of the version it trained on: its clients' evaluations, weighted by their samples."""
    return held_out_mean(c.evaluation for c in clients if c.evaluation is not None)


def federated_evaluations(contributions: Iterable[Contribution]) -> list[FederatedEvaluation]:
    """Per base version of `contributions`, its sites' evaluations (by edge id) and their sample-weighted mean."""
    by_version: dict[int, list[SiteHeldOut]] = {}
    for c in sorted(contributions, key=lambda c: (c.base_version, c.edge_id)):
        if c.evaluation is not None:
            by_version.setdefault(c.base_version, []).append(SiteHeldOut(edge_id=c.edge_id,
                                                                         **c.evaluation.model_dump()))
    evaluations = []
    for version, sites in by_version.items():
        mean = held_out_mean(sites)
        if mean is not None:
            evaluations.append(FederatedEvaluation(version=version, sites=sites, **mean.model_dump()))
    return evaluations


def evaluate_global(config: RunConfig, algorithm: Algorithm, global_: Record, cloud_state: Record) -> Evaluation:
    own = algorithm.evaluate(global_, cloud_state)
    if own is not None:
        return own
    data = load_federated(config.data, config.seed)
    model = load_parameters(initial_model(config), algorithm.model_parameters(global_)).to(current())
    return evaluate(model, data.test)  # on the compute device (shared/core/device.py), batch by batch
