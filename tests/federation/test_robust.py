"""Robust aggregation and DP-FedAvg end to end: a cloud, 3 edges and client workers over the services' HTTP
APIs, with one poisoned client among 12, against the reference runner given the same poisoned client.

Clients 0–10 are hosted by client workers; client 11 (edge 2's) is the test itself, speaking the client
API as any device could: it registers, long-polls its tasks and answers each with a large fixed random
step, claiming its true sample count. Every run of this module is under that attack, so each equality
test also checks that the services aggregate the poisoned update exactly as the reference does.
"""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import cache

import anyio
import pytest
import torch

from fl_services.shared.core.algorithms import privacy
from fl_services.shared.core.algorithms.base import MODEL, ClientResult
from fl_services.shared.core.config import RunConfig
from fl_services.shared.core.data import load_federated
from fl_services.shared.core.edge_round import ClientTask
from fl_services.shared.core.records import Record, decode, encode
from fl_services.shared.core.reference import InProcessClients, run_reference
from fl_services.shared.core.reports import RunStatus
from fl_services.shared.wire.client_edge import ClientResultHeader, ClientTaskHeader
from fl_services.shared.wire.http import binary_body
from tests.federation.checks import assert_same_model, reference, run
from tests.federation.harness import CLIENT_TOKEN, EdgeNode, Federation, federation
from tests.web import bearer

pytestmark = pytest.mark.anyio

EDGES, CLIENTS = 3, 12
ATTACKER = 11  # served by edge 11 mod 3 = 2, with clients 2, 5 and 8


def poison(task: Record) -> Record:
    """What the attacker sends whatever its task: 20 × a fixed N(0, 1) direction (honest steps are ~0.01)."""
    g = torch.Generator().manual_seed(7)
    return {MODEL: {name: 20 * torch.randn(t.shape, generator=g) for name, t in sorted(task[MODEL].items())}}


def config(**overrides) -> RunConfig:
    base = dict(rounds=3, model={"name": "logreg"}, data={"dataset": "digits", "num_clients": CLIENTS},
                local={"lr": 0.1}, topology={"num_edges": EDGES, "buffer_size": EDGES})
    return RunConfig.model_validate({**base, **overrides})


@cache
def attacker_samples() -> int:
    c = config()
    return len(load_federated(c.data, c.seed).clients[ATTACKER].train)


class PoisonedClients(InProcessClients):
    """The reference runner's clients, with the attacker answering as the test does over HTTP."""

    async def train(self, tasks: list[ClientTask]) -> list[ClientResult]:
        honest = await super().train([t for t in tasks if t.client_id != ATTACKER])
        return honest + [ClientResult(ATTACKER, attacker_samples(), 0.0, poison(t.tensors))
                         for t in tasks if t.client_id == ATTACKER]


async def attack(edge: EdgeNode, answered: list[int]) -> None:
    """Client 11 over the edge's client API: answers every task it gets with `poison` (until cancelled)."""
    auth = bearer(CLIENT_TOKEN)

    async def register() -> None:
        response = await edge.http.post("/api/v1/clients", json={"client_id": ATTACKER,
                                                                 "num_samples": attacker_samples()}, headers=auth)
        response.raise_for_status()

    await register()
    while True:
        r = await edge.http.get(f"/api/v1/clients/{ATTACKER}/task", params={"timeout": 1}, headers=auth)
        if r.status_code == 404:  # the edge forgot us (a run of other clients): register again
            await register()
        if r.status_code != 200:
            continue
        task, header = decode(r.content, ClientTaskHeader)
        result = ClientResultHeader(task_id=header.task_id, client_id=ATTACKER, num_samples=attacker_samples(),
                                    loss=0.0)
        answer = await edge.http.post(f"/api/v1/clients/{ATTACKER}/results",
                                      **binary_body(encode(poison(task), result), auth))
        answered.append(answer.status_code)


@asynccontextmanager
async def attacked(cloud_storage, tmp_path) -> AsyncIterator[Federation]:
    """Client workers hosting clients 0..10, and the test as client 11; every upload of the attacker accepted."""
    async with federation(cloud_storage, tmp_path, num_clients=CLIENTS - 1, num_edges=EDGES, procs_per_edge=1) as fed:
        edge = fed.edges[ATTACKER % EDGES]
        answered: list[int] = []
        attacker = asyncio.create_task(attack(edge, answered))
        try:
            with anyio.fail_after(30):
                while (await edge.health()).clients < len(range(edge.edge_id, CLIENTS, EDGES)):
                    await asyncio.sleep(0.02)
            yield fed
        finally:
            attacker.cancel()
            await asyncio.gather(attacker, return_exceptions=True)
    assert answered and set(answered) == {202}, answered


@pytest.fixture
async def admin(cloud_storage, tmp_path):
    async with attacked(cloud_storage, tmp_path) as fed:
        yield fed.admin


@pytest.fixture(scope="module")
def clean_accuracy() -> float:
    """FedAvg's mean without the attack: client 11 honest (reference runner)."""
    return run_reference(config()).history[-1].test_accuracy


async def test_the_mean_follows_the_poisoned_client_and_equals_the_reference(admin, clean_accuracy):
    cfg = config(name="poisoned-mean")
    _, history, model = await run(admin, cfg)
    expected = await reference(cfg, clients=PoisonedClients)
    assert_same_model(model, expected.global_state)
    assert all(ATTACKER in [c.client_id for c in h.clients] for h in history)
    assert history[-1].test_accuracy < clean_accuracy - 0.3, (history[-1].test_accuracy, clean_accuracy)


@pytest.mark.parametrize("aggregation, extra", [
    ({"edge": "median", "cloud": "krum", "krum_byzantine": 0}, {}),
    # Hierarchical FedAvg (κ = 2 edge rounds) under FedProx, trimming one of four at each end at the edge.
    ({"edge": "trimmed_mean", "trim_fraction": 0.25, "cloud": "median"},
     {"algorithm": "fedprox", "params": {"mu": 0.01}, "topology": {"num_edges": EDGES, "buffer_size": EDGES,
                                                                  "edge_rounds": 2}}),
    ({"edge": "krum", "krum_byzantine": 0, "krum_selected": 2, "cloud": "trimmed_mean", "trim_fraction": 0.34}, {}),
], ids=["median+krum", "trimmed+median-fedprox-hierarchical", "multikrum+trimmed"])
async def test_a_robust_aggregator_bounds_the_poisoned_client_and_equals_the_reference(admin, clean_accuracy,
                                                                                        aggregation, extra):
    cfg = config(name="robust", aggregation=aggregation, **extra)
    _, history, model = await run(admin, cfg)
    expected = await reference(cfg, clients=PoisonedClients)
    assert_same_model(model, expected.global_state)
    # Nothing accepted is lost: every client's result, the poisoned one included, is counted in every round.
    assert all({c.client_id for c in h.clients} == set(range(CLIENTS)) for h in history)
    assert [h.test_accuracy for h in history] == pytest.approx([h.test_accuracy for h in expected.history], abs=2e-3)
    assert history[-1].test_accuracy >= clean_accuracy - 0.05, (history[-1].test_accuracy, clean_accuracy)


async def test_edge_noise_records_epsilon_stops_at_the_budget_and_equals_the_reference(admin):
    unlimited = config(weighting="uniform", rounds=4, privacy={"noise": "edge", "noise_multiplier": 2.0,
                                                               "clip_norm": 0.5})
    eps = [privacy.epsilon(unlimited, t) for t in range(1, 5)]
    cfg = config(name="private", weighting="uniform", rounds=4,
                 privacy={"noise": "edge", "noise_multiplier": 2.0, "clip_norm": 0.5,
                          "epsilon_budget": (eps[1] + eps[2]) / 2})
    info = await admin.create_run(cfg)
    await admin.action(info.run_id, "start")
    assert (await admin.wait(info.run_id)).status == RunStatus.finished
    history, model = await admin.history(info.run_id), await admin.model(info.run_id)
    assert [h.version for h in history] == [1, 2]  # the budget allows two of the four rounds
    assert [h.epsilon for h in history] == pytest.approx(eps[:2])
    expected = await reference(cfg, clients=PoisonedClients)
    assert_same_model(model, expected.global_state)


async def test_client_noise_equals_the_reference(admin):
    cfg = config(name="local-dp", weighting="uniform", rounds=2,
                 privacy={"noise": "client", "noise_multiplier": 0.5, "clip_norm": 1.0})
    _, history, model = await run(admin, cfg)
    assert [h.epsilon for h in history] == pytest.approx([privacy.epsilon(cfg, t) for t in (1, 2)])
    assert_same_model(model, (await reference(cfg, clients=PoisonedClients)).global_state)


async def test_dp_sgd_in_local_training_records_its_epsilon_and_equals_the_reference(admin):
    """DP-SGD (opacus) inside each client worker's training: the same noise as the reference runner's, from
    each client's training stream, and ε per training example in every history record."""
    cfg = config(name="dp-sgd", rounds=2, local={"lr": 0.1, "batch_size": 16},
                 privacy={"dp_sgd_noise_multiplier": 1.0, "dp_sgd_clip_norm": 1.0})
    _, history, model = await run(admin, cfg)
    assert [h.dp_sgd_epsilon for h in history] == pytest.approx([privacy.dp_sgd_epsilon(cfg, t) for t in (1, 2)])
    assert_same_model(model, (await reference(cfg, clients=PoisonedClients)).global_state)
