"""A device's sample count cannot be checked where its data is its own: the run's sites view shows the devices
whose claimed count stands far above the round's median (cloud/services/sites.py, sample_outliers)."""
import numpy as np
import pytest

from fl_services.cloud.services.sites import OUTLIER_RATIO
from fl_services.shared.core.config import RunConfig
from fl_services.shared.core.reference import Device
from fl_services.shared.core.reports import RunStatus
from fl_services.shared.wire.admin import RunSites
from tests.federation.harness import SITE_REPORT_S, federation

pytestmark = pytest.mark.anyio

# The run's task: (2, 3) samples, 3 classes (tests.shared.user_factories:as_dict); each device's own file fits it.
CONFIG = RunConfig(name="outliers", rounds=1, model={"name": "logreg"}, fraction=1.0,
                   data={"dataset": "tests.shared.user_factories:as_dict", "options": {"num_clients": 4},
                         "num_clients": 4},
                   local={"epochs": 1, "batch_size": 8, "lr": 0.1},
                   selection={"sites": "all", "min_devices": 4})
ROWS = {11: 20, 22: 24, 33: 20, 44: 600}  # device 44 declares 25-30x the others


async def test_a_device_declaring_far_more_samples_is_flagged(cloud_storage, tmp_path):
    devices = []
    for k, rows in ROWS.items():
        path = tmp_path / f"device{k}.npz"
        rng = np.random.default_rng(k)
        np.savez(path, x=rng.normal(size=(rows, 2, 3)).astype(np.float32), y=rng.integers(0, 3, rows))
        devices.append(Device(k, 0, f"npz:{path}"))
    async with federation(cloud_storage, tmp_path, num_clients=0, devices=devices,
                          cloud={"admission_interval_s": 0.05}, edge={"site_report_s": SITE_REPORT_S}) as fed:
        run_id = (await fed.admin.create_run(CONFIG)).run_id
        await fed.admin.action(run_id, "start")
        final = await fed.admin.wait(run_id, timeout_s=300)
        r = await fed.cloud_request("GET", f"/api/v1/runs/{run_id}/sites")
        history = await fed.admin.history(run_id)
    assert final.status == RunStatus.finished, final
    assert r.status_code == 200, r.text
    seen = RunSites.model_validate_json(r.content)
    claims = {c.client_id: c.num_samples for c in history[-1].clients}
    median = float(np.median(list(claims.values())))
    assert sorted(claims) == sorted(ROWS) and claims[44] > OUTLIER_RATIO * median > max(claims[k] for k in (11, 22, 33))
    assert seen.outliers_round == history[-1].round
    assert [(o.client_id, o.edge_id, o.num_samples, o.median) for o in seen.sample_outliers] == [
        (44, 0, claims[44], median)]
