"""Robust aggregation and DP-FedAvg end to end: a cloud, 3 edges and client processes over real HTTP, with
one poisoned client among 12, against the reference runner given the same poisoned client.

Clients 0–10 are hosted by client processes; client 11 (edge 2's) is the test itself, speaking the client
API as any device could: it registers, long-polls its tasks and answers each with a large fixed random
step, claiming its true sample count. Every run of this module is under that attack, so each equality
test also checks that the services aggregate the poisoned update exactly as the reference does.
"""
from __future__ import annotations

import threading

import httpx
import pytest
import torch

from fl_services.fedctl.api import CloudAPI
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
from tests.integration.topology import federation
from tests.web import bearer

pytestmark = pytest.mark.slow

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


def attacker_samples() -> int:
    c = config()
    return len(load_federated(c.data, c.seed).clients[ATTACKER].train)


class PoisonedClients(InProcessClients):
    """The reference runner's clients, with the attacker answering as the test does over HTTP."""

    async def train(self, tasks: list[ClientTask]) -> list[ClientResult]:
        honest = await super().train([t for t in tasks if t.client_id != ATTACKER])
        return honest + [ClientResult(ATTACKER, attacker_samples(), 0.0, poison(t.tensors))
                         for t in tasks if t.client_id == ATTACKER]


class Attacker(threading.Thread):
    """Client 11 over the edge's client API: answers every task it gets with `poison`."""

    def __init__(self, edge_url: str, token: str):
        super().__init__(daemon=True)
        self.edge_url, self.token = edge_url, token
        self.stopping = threading.Event()
        self.answered: list[int] = []  # the status of each upload
        self.samples = attacker_samples()

    def run(self) -> None:
        with httpx.Client(base_url=self.edge_url, headers=bearer(self.token), timeout=30) as http:
            self.register(http)
            while not self.stopping.is_set():
                r = http.get(f"/api/v1/clients/{ATTACKER}/task", params={"timeout": 1})
                if r.status_code == 404:  # the edge forgot us (a run of other clients): register again
                    self.register(http)
                if r.status_code != 200:
                    continue
                task, header = decode(r.content, ClientTaskHeader)
                result = ClientResultHeader(task_id=header.task_id, client_id=ATTACKER, num_samples=self.samples,
                                            loss=0.0)
                answer = http.post(f"/api/v1/clients/{ATTACKER}/results", **binary_body(encode(poison(task), result)))
                self.answered.append(answer.status_code)

    def register(self, http: httpx.Client) -> None:
        http.post("/api/v1/clients", json={"client_id": ATTACKER, "num_samples": self.samples}).raise_for_status()


@pytest.fixture(scope="module")
def api(tmp_path_factory):
    # The client processes host clients 0..10; the test is client 11.
    with federation(tmp_path_factory, num_clients=CLIENTS - 1, num_edges=EDGES, procs_per_edge=1) as (topo, api):
        attacker = Attacker(topo.edges[ATTACKER % EDGES].address(), topo.client_token)
        attacker.start()
        yield api
        attacker.stopping.set()
        attacker.join(10)
        assert attacker.answered and set(attacker.answered) == {202}, attacker.answered


def run(api: CloudAPI, cfg: RunConfig):
    info = api.create_run(cfg)
    api.action(info.run_id, "start")
    final = api.wait(info.run_id, timeout_s=600)
    assert final.status == RunStatus.finished, final
    return api.history(info.run_id), api.model(info.run_id)


def assert_same_model(distributed, reference, atol=1e-5):
    assert distributed.keys() == reference.keys()
    for name in reference:
        assert torch.allclose(distributed[name], reference[name], atol=atol), name


@pytest.fixture(scope="module")
def clean_accuracy() -> float:
    """FedAvg's mean without the attack: client 11 honest (reference runner)."""
    return run_reference(config()).history[-1].test_accuracy


def test_the_mean_follows_the_poisoned_client_and_equals_the_reference(api, clean_accuracy):
    cfg = config(name="poisoned-mean")
    history, model = run(api, cfg)
    reference = run_reference(cfg, clients=PoisonedClients)
    assert_same_model(model, reference.global_state)
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
def test_a_robust_aggregator_bounds_the_poisoned_client_and_equals_the_reference(api, clean_accuracy, aggregation,
                                                                                  extra):
    cfg = config(name="robust", aggregation=aggregation, **extra)
    history, model = run(api, cfg)
    reference = run_reference(cfg, clients=PoisonedClients)
    assert_same_model(model, reference.global_state)
    # Nothing accepted is lost: every client's result, the poisoned one included, is counted in every round.
    assert all({c.client_id for c in h.clients} == set(range(CLIENTS)) for h in history)
    assert [h.test_accuracy for h in history] == pytest.approx([h.test_accuracy for h in reference.history], abs=2e-3)
    assert history[-1].test_accuracy >= clean_accuracy - 0.05, (history[-1].test_accuracy, clean_accuracy)


def test_edge_noise_records_epsilon_stops_at_the_budget_and_equals_the_reference(api):
    unlimited = config(weighting="uniform", rounds=4, privacy={"noise": "edge", "noise_multiplier": 2.0,
                                                               "clip_norm": 0.5})
    eps = [privacy.epsilon(unlimited, t) for t in range(1, 5)]
    cfg = config(name="private", weighting="uniform", rounds=4,
                 privacy={"noise": "edge", "noise_multiplier": 2.0, "clip_norm": 0.5,
                          "epsilon_budget": (eps[1] + eps[2]) / 2})
    history, model = run(api, cfg)
    assert [h.version for h in history] == [1, 2]  # the budget allows two of the four rounds
    assert [h.epsilon for h in history] == pytest.approx(eps[:2])
    reference = run_reference(cfg, clients=PoisonedClients)
    assert_same_model(model, reference.global_state)


def test_client_noise_equals_the_reference(api):
    cfg = config(name="local-dp", weighting="uniform", rounds=2,
                 privacy={"noise": "client", "noise_multiplier": 0.5, "clip_norm": 1.0})
    history, model = run(api, cfg)
    assert [h.epsilon for h in history] == pytest.approx([privacy.epsilon(cfg, t) for t in (1, 2)])
    assert_same_model(model, run_reference(cfg, clients=PoisonedClients).global_state)


def test_dp_sgd_in_local_training_records_its_epsilon_and_equals_the_reference(api):
    """DP-SGD (opacus) inside each client process's training: the same noise as the reference runner's, from
    each client's training stream, and ε per training example in every history record."""
    cfg = config(name="dp-sgd", rounds=2, local={"lr": 0.1, "batch_size": 16},
                 privacy={"dp_sgd_noise_multiplier": 1.0, "dp_sgd_clip_norm": 1.0})
    history, model = run(api, cfg)
    assert [h.dp_sgd_epsilon for h in history] == pytest.approx([privacy.dp_sgd_epsilon(cfg, t) for t in (1, 2)])
    assert_same_model(model, run_reference(cfg, clients=PoisonedClients).global_state)
