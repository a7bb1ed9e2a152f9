"""The site registry as the dashboard's topology view and run page read it: each site online or offline, its
devices per state and the listed ones, a run's sites with its current round there and whether every device of it
failed; and the headers the pages are served with."""
from __future__ import annotations

import asyncio
from datetime import datetime, timezone
from typing import Any

import pytest

from fl_services.shared.wire.admin import RunSites, SiteInfo
from fl_services.shared.wire.edge_cloud import MAX_REPORTED_DEVICES
from tests.cloud.harness import UNKNOWN_RUN, Cloud, two_edge_config
from tests.web import detail_of

pytestmark = pytest.mark.anyio

SEEN = datetime(2026, 5, 6, 7, 8, 9, tzinfo=timezone.utc).isoformat()
MISFIT = "DataMisfit: its samples have shape 3x2 but the run's model takes 2x3"


def device(client_id: int, state: str, **fields: Any) -> dict[str, Any]:
    return {"client_id": client_id, "state": state, "last_seen": SEEN, **fields}


async def report(cloud: Cloud, edge_id: int, name: str, **fields: Any) -> None:
    r = await cloud.edge("POST", "/api/v1/edges", json={"edge_id": edge_id, "name": name, **fields})
    assert r.status_code == 200, r.text


async def sites(cloud: Cloud) -> list[SiteInfo]:
    r = await cloud.admin("GET", "/api/v1/sites")
    assert r.status_code == 200, r.text
    return [SiteInfo.model_validate(s) for s in r.json()]


async def run_sites(cloud: Cloud, run_id: str) -> RunSites:
    r = await cloud.admin("GET", f"/api/v1/runs/{run_id}/sites")
    assert r.status_code == 200, r.text
    return RunSites.model_validate_json(r.content)


async def test_sites_show_their_devices_per_state_and_go_offline_when_reports_stop(cloud: Cloud):
    await report(cloud, 0, "lyon", devices=3, report_s=60, states={"training": 2, "failed": 1},
                 device_page=[device(4, "failed", failure=MISFIT, failed_run="r"), device(0, "training", runs=["r"]),
                              device(2, "training", runs=["r"], samples=120, family="cnn")])
    await report(cloud, 1, "paris", devices=0, report_s=0.01)
    await asyncio.sleep(0.1)  # more than three of paris's report intervals without a report
    lyon, paris = await sites(cloud)
    assert (lyon.name, lyon.status, lyon.states) == ("lyon", "online", {"training": 2, "failed": 1})
    assert [(d.client_id, d.state, d.failure) for d in lyon.device_page] == [
        (4, "failed", MISFIT), (0, "training", None), (2, "training", None)]
    assert (lyon.device_page[2].samples, lyon.device_page[2].family) == (120, "cnn")
    assert (paris.name, paris.status) == ("paris", "offline")
    await report(cloud, 1, "paris", devices=0, report_s=60)  # reports again: online
    assert [s.status for s in await sites(cloud)] == ["online", "online"]


async def test_a_report_listing_more_devices_than_the_cap_is_refused_and_changes_nothing(cloud: Cloud):
    await report(cloud, 0, "lyon", devices=1, states={"idle": 1})
    page = [device(k, "idle") for k in range(MAX_REPORTED_DEVICES + 1)]
    r = await cloud.edge("POST", "/api/v1/edges", json={"edge_id": 0, "name": "lyon", "device_page": page})
    detail_of(r, 422, "device_page")
    r = await cloud.edge("POST", "/api/v1/edges", json={"edge_id": 0, "name": "lyon", "states": {"asleep": 1}})
    detail_of(r, 422, "states")
    (lyon,) = await sites(cloud)
    assert (lyon.devices, lyon.states) == (1, {"idle": 1})


async def test_a_runs_sites_say_which_devices_train_it_which_failed_and_whether_all_did(cloud: Cloud):
    run_id = await cloud.create_run(two_edge_config())
    other = "someotherrun"
    await report(cloud, 0, "lyon", runs=[{"run_id": run_id, "tasks": 2, "answered": 0, "failed": 1},
                                         {"run_id": other, "tasks": 5, "answered": 5, "failed": 0}],
                 device_page=[device(4, "failed", failure=MISFIT, failed_run=run_id),
                              device(5, "failed", failure="another run's", failed_run=other),
                              device(0, "training", runs=[run_id]), device(1, "idle")])
    seen = await run_sites(cloud, run_id)
    lyon, edge1 = seen.sites
    assert (lyon.name, lyon.edge_id, lyon.status, lyon.tasks, lyon.answered, lyon.failed) == (
        "lyon", 0, "online", 2, 0, 1)
    assert [d.client_id for d in lyon.devices] == [4, 0]  # this run's: not 5 (another's), not 1 (idle)
    assert (edge1.name, edge1.edge_id, edge1.tasks) == (None, 1, 0)  # edge 1 never registered as a site
    assert not seen.all_failed and seen.reasons == [MISFIT]
    # Every device given a task of the current round, at every site, reported it could not train it.
    await report(cloud, 0, "lyon", runs=[{"run_id": run_id, "tasks": 2, "answered": 0, "failed": 2}],
                 device_page=[device(0, "failed", failure="OSError: disk full", failed_run=run_id),
                              device(4, "failed", failure=MISFIT, failed_run=run_id)])
    await report(cloud, 1, "paris", runs=[{"run_id": run_id, "tasks": 1, "answered": 0, "failed": 1}],
                 device_page=[device(3, "failed", failure=MISFIT, failed_run=run_id)])
    seen = await run_sites(cloud, run_id)
    assert seen.all_failed and seen.reasons == [MISFIT, "OSError: disk full"]
    assert [(s.name, s.failed) for s in seen.sites] == [("lyon", 2), ("paris", 1)]
    detail_of(await cloud.admin("GET", f"/api/v1/runs/{UNKNOWN_RUN}/sites"), 404, UNKNOWN_RUN)


@pytest.mark.parametrize("path", ["/ui/", "/ui/run.html", "/ui/topology.html", "/ui/js/api.js", "/ui/app.css"])
async def test_the_pages_are_served_with_a_strict_content_security_policy(cloud: Cloud, path: str):
    r = await cloud.http.get(path)
    assert r.status_code == 200, path
    assert r.headers["x-frame-options"] == "DENY"
    assert r.headers["x-content-type-options"] == "nosniff"
    policy = dict(part.strip().split(" ", 1) for part in r.headers["content-security-policy"].split(";"))
    assert "unsafe" not in r.headers["content-security-policy"]  # no 'unsafe-inline', no 'unsafe-eval'
    assert policy["default-src"] == "'none'" and policy["frame-ancestors"] == "'none'"
    assert policy["script-src"] == "'self'" and policy["connect-src"] == "'self'"


async def test_the_api_docs_link_back_to_the_dashboard(cloud: Cloud):
    description = (await cloud.http.get("/openapi.json")).json()["info"]["description"]
    assert "](/ui/)" in description and "](/ui/topology.html)" in description
