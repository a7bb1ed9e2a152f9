"""A run's sites and devices as the operator reads them through the services: the edges' site reports carry each
device's state and failure to the cloud, whose run view says when every device of the current round failed."""
import asyncio
import time

import numpy as np
import pytest

from fl_services.shared.core.config import RunConfig
from fl_services.shared.core.reference import Device
from fl_services.shared.core.reports import RunStatus
from fl_services.shared.wire.admin import RunSites, SiteInfo
from tests.federation.harness import SITE_REPORT_S, federation

pytestmark = pytest.mark.anyio

# The run's task: (2, 3) samples, 3 classes (tests.shared.user_factories:as_dict); every device's own file holds 3x2.
CONFIG = RunConfig(name="all-fail", rounds=2, model={"name": "logreg"},
                   data={"dataset": "tests.shared.user_factories:as_dict", "options": {"num_clients": 4},
                         "partition": "file", "num_clients": 4},
                   topology={"num_edges": 2, "buffer_size": 2},
                   policy={"deadline_s": 600, "min_fraction": 0.5, "max_retries": 0})


async def test_a_run_whose_every_device_fails_says_so_with_the_reasons(cloud_storage, tmp_path):
    path = tmp_path / "transposed.npz"
    x = np.random.default_rng(1).normal(size=(30, 3, 2)).astype(np.float32)
    np.savez(path, x=x, y=(x[:, 0, 0] > 0).astype(np.int64))
    names = ["lyon", "boston"]
    async with federation(cloud_storage, tmp_path, num_clients=4, num_edges=2, procs_per_edge=2,
                          edge=lambda e: {"name": names[e], "site_report_s": 0.2},
                          client={"data": f"npz:{path}"},
                          # No admission pass after the first: it would stop the run (every device failed) before
                          # the operator's stop, which this test keeps to read the sites while the run is running.
                          cloud={"admission_interval_s": 3600}) as fed:
        run_id = (await fed.admin.create_run(CONFIG)).run_id
        await fed.admin.action(run_id, "start")
        deadline = time.monotonic() + 120
        while True:
            r = await fed.cloud_request("GET", f"/api/v1/runs/{run_id}/sites")
            assert r.status_code == 200, r.text
            seen = RunSites.model_validate_json(r.content)
            if seen.all_failed and all(s.failed == 2 for s in seen.sites):
                break
            assert time.monotonic() < deadline, seen
            await asyncio.sleep(0.1)
        r = await fed.cloud_request("GET", "/api/v1/sites")
        sites = [SiteInfo.model_validate(s) for s in r.json()]
        await fed.admin.action(run_id, "stop")
        history = await fed.admin.history(run_id)
    assert [(s.name, s.edge_id, s.status, s.tasks, s.answered) for s in seen.sites] == [
        ("lyon", 0, "online", 2, 0), ("boston", 1, "online", 2, 0)]
    assert [sorted(d.client_id for d in s.devices) for s in seen.sites] == [[0, 2], [1, 3]]
    assert all(d.state == "failed" and d.failed_run == run_id for s in seen.sites for d in s.devices)
    assert len(seen.reasons) == 1 and "DataMisfit" in seen.reasons[0], seen.reasons
    assert "its samples have shape 3x2 but the run's model takes 2x3" in seen.reasons[0]
    assert [(s.name, s.states) for s in sites] == [("boston", {"failed": 2}), ("lyon", {"failed": 2})]
    assert history == []  # no edge had a result to send


async def test_a_run_whose_connected_devices_all_misfit_is_not_admitted_and_stops_past_its_timeout(cloud_storage,
                                                                                                    tmp_path):
    """Two devices are connected, but neither can train the run (its samples are 3x2, the run's model takes 2x3): the
    site reports them by their data's fit, so the cloud does not count them towards min_devices, and once
    start_timeout_s passed the waiting run stops, saying so."""
    path = tmp_path / "transposed.npz"
    x = np.random.default_rng(1).normal(size=(30, 3, 2)).astype(np.float32)
    np.savez(path, x=x, y=(x[:, 0, 0] > 0).astype(np.int64))
    config = RunConfig.model_validate({**CONFIG.model_dump(exclude={"topology"}),
                                       "selection": {"min_devices": 2, "start_timeout_s": 3.0}})
    async with federation(cloud_storage, tmp_path, num_clients=0, cloud={"admission_interval_s": 0.05},
                          edge={"site_report_s": SITE_REPORT_S},
                          devices=[Device(k, 0, f"npz:{path}") for k in (11, 12)]) as fed:
        run_id = (await fed.admin.create_run(config)).run_id
        await fed.admin.action(run_id, "start")
        final = await fed.admin.wait(run_id, timeout_s=120)
        r = await fed.cloud_request("GET", "/api/v1/sites")
        [site] = [SiteInfo.model_validate(s) for s in r.json()]
    assert final.status == RunStatus.stopped and final.version == 0 and final.started_at is not None
    assert final.reason is not None and "for 2 devices" in final.reason, final.reason
    assert "0 able to train it connected (2 more whose data does not fit it)" in final.reason, final.reason
    assert site.label_sets is not None and [(s.devices, s.fit.input_shape if s.fit else None)
                                            for s in site.label_sets] == [(2, (3, 2))]
