"""Every algorithm of the catalogue through the services equals the in-process reference.

Partial participation (λ = 0.5) and E = 2 local epochs, so selection, client state, server memory and
sub-models are all exercised across the services' HTTP APIs; hierarchical runs use two edges.
"""
from typing import Any

import pytest

from fl_services.shared.core.config import RunConfig
from tests.federation.checks import assert_equals_reference
from tests.federation.harness import Admin, federation

pytestmark = pytest.mark.anyio

BASE = dict(model={"name": "mlp"}, data={"dataset": "digits", "partition": "dirichlet", "alpha": 0.5, "num_clients": 6},
            local={"epochs": 2, "batch_size": 16, "lr": 0.05}, fraction=0.5, rounds=3)

# The algorithms whose overrides name no client (no cluster map, no capacities): a run over registered devices
# (tests/federation/test_selected.py) takes them as they are.
ANY_CLIENTS: dict[str, dict[str, Any]] = {
    "fedavg": {},
    "fedavg-nesterov": {"algorithm": "fedavg", "local": {**BASE["local"], "optimizer": "nesterov", "lr": 0.02}},
    "fedsgd": {"local": {"lr": 0.5, "batch_size": 0}},
    "fedprox": {"params": {"mu": 0.5}},
    "scaffold": {},
    "fedvarp": {},
}
# pFedMe in few steps: R = 5 batches of 32 (the 99-sample client's batch stream still runs past an epoch), K = 2
# inner steps on each, where the defaults take 100 steps per client and round.
SHORT_PFEDME = {"params": {"local_rounds": 5, "inner_steps": 2}, "local": {**BASE["local"], "batch_size": 32}}
FLAT = {
    **ANY_CLIENTS,
    "clusterfedvarp": {"params": {"num_clusters": 2}},
    "fedrolex": {},
    "fedscavar": {"params": {"mu": 0.1, "num_clusters": 2}},
    "pfedme": {**SHORT_PFEDME, "evaluation": "both"},  # devices evaluate too: the same figures as the reference's
}
HIERARCHICAL = {
    "fedavg-2edges": {"algorithm": "fedavg"},
    # Devices evaluate in the first of the κ edge rounds, whose task carries the global model.
    "fedavg-2edges-kappa2": {"algorithm": "fedavg", "topology": {"num_edges": 2, "buffer_size": 2, "edge_rounds": 2},
                             "evaluation": "both"},
    "fedprox-2edges": {"algorithm": "fedprox", "params": {"mu": 0.5}},
    "scaffold-2edges": {"algorithm": "scaffold", "evaluation": "federated"},
}


def config_for(name: str, overrides: dict, edges: int) -> RunConfig:
    fields = {**BASE, "name": name, "algorithm": name, "topology": {"num_edges": edges, "buffer_size": edges}}
    return RunConfig.model_validate({**fields, **overrides})


async def check_against_reference(admin: Admin, config: RunConfig):
    run_id = (await admin.create_run(config)).run_id
    await admin.action(run_id, "start")
    history = await assert_equals_reference(admin, run_id, config)
    if config.evaluation != "cloud":  # every update has the devices' figures of the version it started from
        assert [[f.version for f in h.federated] for h in history] == [[h.round] for h in history]
    return history


@pytest.mark.parametrize("name", list(FLAT))
async def test_flat_algorithm_equals_reference(cloud_storage, tmp_path, name):
    async with federation(cloud_storage, tmp_path, num_clients=6, num_edges=1, procs_per_edge=2) as fed:
        history = await check_against_reference(fed.admin, config_for(name, FLAT[name], 1))
    # Each round lists the m = ⌊λN⌋ = 3 clients whose updates entered the model; for pFedMe, whose six
    # clients all train every round, that is its sample S.
    assert all(len(h.clients) == 3 for h in history)


@pytest.mark.parametrize("name", list(HIERARCHICAL))
async def test_hierarchical_equals_reference(cloud_storage, tmp_path, name):
    async with federation(cloud_storage, tmp_path, num_clients=6, num_edges=2, procs_per_edge=1) as fed:
        await check_against_reference(fed.admin, config_for(name, HIERARCHICAL[name], 2))


@pytest.mark.parametrize("name", ["fedvarp", "clusterfedvarp", "fedscavar"])
async def test_global_server_memory_refuses_several_edges(cloud_storage, tmp_path, name):
    async with federation(cloud_storage, tmp_path, num_clients=6, num_edges=2, procs_per_edge=1) as fed:
        response = await fed.admin.http.post("/api/v1/runs", json={**BASE, "algorithm": name,
                                                                    "topology": {"num_edges": 2, "buffer_size": 2}})
    assert response.status_code == 422
    assert "one edge" in response.text
