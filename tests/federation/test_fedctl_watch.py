"""A run over registered sites as an operator follows it: `fedctl watch` names each round's sites as the registry
does (not by edge id), and a run that models no device (no dvfs section) reports no energy: the API's history
leaves it out (null) and fedctl shows – where a DVFS run shows joules (tests/federation/test_dvfs.py)."""
import asyncio

import pytest
from rich.console import Console
from typer.testing import CliRunner

from fl_services.fedctl import __main__ as fedctl
from fl_services.fedctl import display
from fl_services.fedctl.api import CloudAPI
from fl_services.shared.core.config import RunConfig
from fl_services.shared.core.reference import Device
from fl_services.shared.core.reports import RunStatus
from tests.federation.harness import ADMIN_TOKEN, CLOUD_URL, SITE_REPORT_S, federation

pytestmark = pytest.mark.anyio

DATA = "partition:digits?clients=2&index={}"
CONFIG = RunConfig(name="watched", rounds=2, model={"name": "logreg"}, data={"dataset": "digits", "num_clients": 2},
                   local={"epochs": 1, "batch_size": 32, "lr": 0.1},
                   selection={"sites": ["lyon"], "min_devices": 2})


async def test_fedctl_watch_names_the_sites_and_a_run_without_dvfs_reports_no_energy(cloud_storage, tmp_path,
                                                                                        monkeypatch):
    async with federation(cloud_storage, tmp_path, num_clients=0, edge={"name": "lyon", "site_report_s": SITE_REPORT_S},
                          cloud={"admission_interval_s": 0.05},
                          devices=[Device(k, 0, DATA.format(i)) for i, k in enumerate((7, 9))]) as fed:
        run_id = (await fed.admin.create_run(CONFIG)).run_id
        await fed.admin.action(run_id, "start")
        assert (await fed.admin.wait(run_id, timeout_s=300)).status == RunStatus.finished
        r = await fed.cloud_request("GET", f"/api/v1/runs/{run_id}/history")
        assert r.status_code == 200, r.text
        history = r.json()
        bridge = fed.cloud_bridge()
        monkeypatch.setattr(fedctl, "cloud_api", lambda cloud, token: CloudAPI(cloud, token, transport=bridge))
        monkeypatch.setattr(display, "console", Console(width=200))
        watched = await asyncio.to_thread(CliRunner().invoke, fedctl.app, [
            "watch", run_id, "--cloud", CLOUD_URL, "--token", ADMIN_TOKEN, "--out", str(tmp_path / "results")])
        shown = await asyncio.to_thread(CliRunner().invoke, fedctl.app, [
            "results", run_id, "--cloud", CLOUD_URL, "--token", ADMIN_TOKEN])
    assert len(history) == 2
    assert all(h["energy_j"] is None for h in history), history  # not measured: no device is modelled
    assert all(c["device"] is None for h in history for c in h["clients"])
    for printed in (watched, shown):
        assert printed.exit_code == 0, printed.output
        rows = [line.split() for line in printed.output.splitlines() if line.strip()[:1].isdigit()]
        assert [r[0] for r in rows] == ["0", "1"], printed.output
        for row in rows:  # round, clients, failed, edges, train loss, test loss, test acc, time, energy J, total J
            assert row[3] == "lyon" and row[-2:] == ["–", "–"], printed.output


async def test_fedctl_runs_says_what_a_waiting_run_waits_for(cloud_storage, tmp_path, monkeypatch):
    """One of the two devices the run needs is connected: while it waits, its line says so (not only once it stops
    at its start timeout)."""
    async with federation(cloud_storage, tmp_path, num_clients=0, edge={"name": "lyon", "site_report_s": SITE_REPORT_S},
                          cloud={"admission_interval_s": 0.05}, devices=[Device(7, 0, DATA.format(0))]) as fed:
        run_id = (await fed.admin.create_run(CONFIG)).run_id
        await fed.admin.action(run_id, "start")
        # The first reason may predate the device's first report to its site (a loaded machine): wait for it.
        for _ in range(600):
            info = await fed.admin.run(run_id)
            if info.reason is not None and "; 1 able" in info.reason:
                break
            await asyncio.sleep(0.05)
        assert info.status == RunStatus.waiting
        bridge = fed.cloud_bridge()
        monkeypatch.setattr(fedctl, "cloud_api", lambda cloud, token: CloudAPI(cloud, token, transport=bridge))
        listed = await asyncio.to_thread(CliRunner().invoke, fedctl.app, [
            "runs", "--cloud", CLOUD_URL, "--token", ADMIN_TOKEN])
    assert listed.exit_code == 0, listed.output
    [line] = [line for line in listed.output.splitlines() if line.startswith(run_id)]
    assert line.split()[1] == "waiting", line
    assert line.endswith("(waiting up to 600 s for 2 devices at its sites [0]; 1 able to train it connected)"), line
