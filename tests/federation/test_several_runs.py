"""Three runs of different algorithms at once on one cloud: two edges serve every run that includes them,
each client worker trains for every run its logical clients belong to, and each run ends on exactly its
in-process reference model."""
import asyncio

import pytest

from fl_services.shared.core.config import RunConfig
from tests.federation.checks import assert_equals_reference
from tests.federation.harness import federation
from tests.federation.test_catalogue import BASE

pytestmark = pytest.mark.anyio

RUNS = {
    # Both edges, clients 0..7 (four per client worker).
    "fedavg": {"topology": {"num_edges": 2, "buffer_size": 2}, "data": {**BASE["data"], "num_clients": 8}},
    # Both edges, clients 0..5, client state on the clients' disks and server memory.
    "scaffold": {"topology": {"num_edges": 2, "buffer_size": 2}},
    # Edge 0 alone (edge 1 never sees it), its one client 0 shared with both other runs.
    "fedvarp": {"topology": {"num_edges": 1, "buffer_size": 1}, "data": {**BASE["data"], "num_clients": 1},
                "rounds": 4},
}


async def test_three_runs_at_once_each_equal_their_reference(cloud_storage, tmp_path):
    configs = {name: RunConfig.model_validate({**BASE, "name": name, "algorithm": name, **overrides})
               for name, overrides in RUNS.items()}
    async with federation(cloud_storage, tmp_path, num_clients=8, num_edges=2, procs_per_edge=1) as fed:
        admin = fed.admin
        run_ids = {name: (await admin.create_run(config)).run_id for name, config in configs.items()}
        for run_id in run_ids.values():
            await admin.action(run_id, "start")
        assert {info.run_id for info in await admin.runs() if info.status.value == "running"} >= set(run_ids.values())
        await asyncio.gather(*(assert_equals_reference(admin, run_ids[name], config, timeout_s=600)
                               for name, config in configs.items()))
        infos = {name: await admin.run(run_id) for name, run_id in run_ids.items()}
        fedvarp = await admin.history(run_ids["fedvarp"])
    # They ran at once: each started before any of the others finished.
    assert max(i.started_at for i in infos.values()) < min(i.finished_at for i in infos.values())
    assert all(h.edges == [0] and [c.client_id for c in h.clients] == [0] for h in fedvarp)
