"""Every algorithm of the catalogue through the real services equals the in-process reference.

Partial participation (λ = 0.5) and E = 2 local epochs, so selection, client state, server memory and
sub-models are all exercised across process boundaries; hierarchical runs use two edges.
"""
import pytest
import torch

from fl_services.fedctl.api import CloudAPI
from fl_services.shared.core.config import RunConfig
from fl_services.shared.core.reference import run_reference
from fl_services.shared.core.reports import RoundRecord, RunStatus
from tests.integration.topology import federation

pytestmark = pytest.mark.slow

BASE = dict(model={"name": "mlp"}, data={"dataset": "digits", "partition": "dirichlet", "alpha": 0.5, "num_clients": 6},
            local={"epochs": 2, "batch_size": 16, "lr": 0.05}, fraction=0.5, rounds=3)

FLAT = {
    "fedavg": {},
    "fedavg-nesterov": {"algorithm": "fedavg", "local": {**BASE["local"], "optimizer": "nesterov", "lr": 0.02}},
    "fedsgd": {"local": {"lr": 0.5, "batch_size": 0}},
    "fedprox": {"params": {"mu": 0.5}},
    "scaffold": {},
    "fedvarp": {},
    "clusterfedvarp": {"params": {"num_clusters": 2}},
    "fedrolex": {},
    "fedscavar": {"params": {"mu": 0.1, "num_clusters": 2}},
    "pfedme": {},
}
HIERARCHICAL = {
    "fedavg-2edges": {"algorithm": "fedavg"},
    "fedavg-2edges-kappa2": {"algorithm": "fedavg", "topology": {"num_edges": 2, "buffer_size": 2, "edge_rounds": 2}},
    "fedprox-2edges": {"algorithm": "fedprox", "params": {"mu": 0.5}},
    "scaffold-2edges": {"algorithm": "scaffold"},
}


def config_for(name: str, overrides: dict, edges: int) -> RunConfig:
    fields = {**BASE, "name": name, "algorithm": name, "topology": {"num_edges": edges, "buffer_size": edges}}
    return RunConfig.model_validate({**fields, **overrides})


@pytest.fixture(scope="module")
def flat(tmp_path_factory):
    with federation(tmp_path_factory, num_clients=6, num_edges=1, procs_per_edge=2) as (_, api):
        yield api


@pytest.fixture(scope="module")
def two_edges(tmp_path_factory):
    with federation(tmp_path_factory, num_clients=6, num_edges=2, procs_per_edge=1) as (_, api):
        yield api


def check_against_reference(api: CloudAPI, config: RunConfig) -> list[RoundRecord]:
    run_id = api.create_run(config).run_id
    api.action(run_id, "start")
    return assert_equals_reference(api, run_id, config)


def assert_equals_reference(api: CloudAPI, run_id: str, config: RunConfig, timeout_s: float = 300) -> list[RoundRecord]:
    """Waits for the run to finish; its clients, model, accuracies and client metrics are the reference's."""
    final = api.wait(run_id, timeout_s=timeout_s)
    assert final.status == RunStatus.finished and final.version == config.rounds
    history = api.history(run_id)
    reference = run_reference(config)
    assert [[(c.client_id, c.edge_id) for c in h.clients] for h in history] ==\
        [[(c.client_id, c.edge_id) for c in h.clients] for h in reference.history]
    model = api.model(run_id)
    expected = reference.global_state  # the model as the REST API serves it (model_parameters)
    assert model.keys() == expected.keys()
    for name in model:
        assert torch.allclose(model[name], expected[name], atol=1e-5), name
    for got, want in zip(history, reference.history, strict=True):
        assert got.test_accuracy == pytest.approx(want.test_accuracy, abs=3e-3)
        assert got.client_metrics == pytest.approx(want.client_metrics, abs=1e-6)
    return history


@pytest.mark.parametrize("name", list(FLAT))
def test_flat_algorithm_equals_reference(flat, name):
    history = check_against_reference(flat, config_for(name, FLAT[name], 1))
    # Each round lists the m = ⌊λN⌋ = 3 clients whose updates entered the model; for pFedMe, whose six
    # clients all train every round, that is its sample S.
    assert all(len(h.clients) == 3 for h in history)


@pytest.mark.parametrize("name", list(HIERARCHICAL))
def test_hierarchical_equals_reference(two_edges, name):
    check_against_reference(two_edges, config_for(name, HIERARCHICAL[name], 2))


@pytest.mark.parametrize("name", ["fedvarp", "clusterfedvarp", "fedscavar"])
def test_global_server_memory_refuses_several_edges(two_edges, name):
    response = two_edges.http.post("/api/v1/runs", json={**BASE, "algorithm": name,
                                                          "topology": {"num_edges": 2, "buffer_size": 2}})
    assert response.status_code == 422
    assert "one edge" in response.text
