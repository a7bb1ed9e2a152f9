"""Three runs of different algorithms at once on one cloud, through the real services: two edges serve
every run that includes them, each client process trains for every run its logical clients belong to,
and each run ends on exactly its in-process reference model."""
import pytest

from fl_services.shared.core.config import RunConfig
from tests.integration.test_catalogue_services import BASE, assert_equals_reference
from tests.integration.topology import federation

pytestmark = pytest.mark.slow

RUNS = {
    # Both edges, clients 0..7 (four per client process).
    "fedavg": {"topology": {"num_edges": 2, "buffer_size": 2}, "data": {**BASE["data"], "num_clients": 8}},
    # Both edges, clients 0..5, client state on the clients' disks and server memory.
    "scaffold": {"topology": {"num_edges": 2, "buffer_size": 2}},
    # Edge 0 alone (edge 1 never sees it), its one client 0 shared with both other runs.
    "fedvarp": {"topology": {"num_edges": 1, "buffer_size": 1}, "data": {**BASE["data"], "num_clients": 1},
                "rounds": 4},
}


@pytest.fixture(scope="module")
def api(tmp_path_factory):
    with federation(tmp_path_factory, num_clients=8, num_edges=2, procs_per_edge=1) as (_, api):
        yield api


def test_three_runs_at_once_each_equal_their_reference(api):
    configs = {name: RunConfig.model_validate({**BASE, "name": name, "algorithm": name, **overrides})
               for name, overrides in RUNS.items()}
    run_ids = {name: api.create_run(config).run_id for name, config in configs.items()}
    for run_id in run_ids.values():
        api.action(run_id, "start")
    assert {info.run_id for info in api.runs() if info.status.value == "running"} >= set(run_ids.values())
    for name, config in configs.items():
        assert_equals_reference(api, run_ids[name], config, timeout_s=600)
    infos = {name: api.run(run_id) for name, run_id in run_ids.items()}
    # They ran at once: each started before any of the others finished.
    assert max(i.started_at for i in infos.values()) < min(i.finished_at for i in infos.values())
    fedvarp = api.history(run_ids["fedvarp"])
    assert all(h.edges == [0] and [c.client_id for c in h.clients] == [0] for h in fedvarp)
