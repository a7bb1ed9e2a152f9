"""The site registry as the dashboard's topology view and run page read it: each site online or offline, its
devices per state and the listed ones, a run's sites with its current round there and whether every device of it
failed; and the headers the pages are served with."""
from __future__ import annotations

import asyncio
import base64
import hashlib
import re
from datetime import datetime, timezone
from typing import Any

import pytest

from fl_services.cloud.audit import Auditor
from fl_services.cloud.routes.ui import STATIC
from fl_services.cloud.services import sites as sites_service
from fl_services.shared.wire.admin import RunSites, SiteInfo
from fl_services.shared.wire.edge_cloud import MAX_REPORTED_DEVICES
from tests.cloud.harness import UNKNOWN_RUN, Cloud, small_config, two_edge_config
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
    for ids, said in (([[0, 9]], "exactly the set's 2 devices"), ([[3, 3], [1, 1]], "ascending, disjoint"),
                      ([[5, 4]], "ascending, disjoint")):
        r = await cloud.edge("POST", "/api/v1/edges", json={"edge_id": 0, "name": "lyon", "label_sets": [
            {"labels": {}, "devices": 2, "ids": ids}]})
        detail_of(r, 422, said)
    (lyon,) = await sites(cloud)
    assert (lyon.devices, lyon.states) == (1, {"idle": 1})


async def test_a_runs_sites_say_which_devices_train_it_which_failed_and_whether_all_did(cloud: Cloud):
    run_id = await cloud.create_run(two_edge_config())
    other = "someotherrun"
    await report(cloud, 0, "lyon", runs=[{"run_id": run_id, "version": 0, "tasks": 2, "answered": 0, "failed": 1},
                                         {"run_id": other, "version": 3, "tasks": 5, "answered": 5, "failed": 0}],
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
    await report(cloud, 0, "lyon", runs=[{"run_id": run_id, "version": 0, "tasks": 2, "answered": 0, "failed": 2}],
                 device_page=[device(0, "failed", failure="OSError: disk full", failed_run=run_id),
                              device(4, "failed", failure=MISFIT, failed_run=run_id)])
    await report(cloud, 1, "paris", runs=[{"run_id": run_id, "version": 0, "tasks": 1, "answered": 0, "failed": 1}],
                 device_page=[device(3, "failed", failure=MISFIT, failed_run=run_id)])
    seen = await run_sites(cloud, run_id)
    assert seen.all_failed and seen.reasons == [MISFIT, "OSError: disk full"]
    assert [(s.name, s.failed) for s in seen.sites] == [("lyon", 2), ("paris", 1)]
    # A tally of another version than the run's current one says nothing of the current round.
    await report(cloud, 1, "paris", runs=[{"run_id": run_id, "version": 1, "tasks": 1, "answered": 0, "failed": 1}],
                 device_page=[device(3, "failed", failure=MISFIT, failed_run=run_id)])
    assert not (await run_sites(cloud, run_id)).all_failed
    detail_of(await cloud.admin("GET", f"/api/v1/runs/{UNKNOWN_RUN}/sites"), 404, UNKNOWN_RUN)


async def test_a_selection_of_all_or_by_label_takes_the_online_sites_only(cloud: Cloud):
    """An offline site would never contribute: a synchronous run waiting for every site it has would not move."""
    await report(cloud, 0, "lyon", labels={"region": "eu"}, report_s=60)
    await report(cloud, 1, "paris", labels={"region": "eu"}, report_s=0.01)
    await asyncio.sleep(0.1)  # paris: offline
    for sites_ in ("all", {"region": "eu"}):
        info = (await cloud.admin("POST", "/api/v1/runs", json=small_config(selection={"sites": sites_}))).json()
        assert info["config"]["selection"]["edge_ids"] == [0], sites_
        assert info["config"]["topology"]["buffer_size"] == 1
    # Named one by one, a site is taken as named.
    info = (await cloud.admin("POST", "/api/v1/runs", json=small_config(selection={"sites": ["lyon", "paris"]}))).json()
    assert info["config"]["selection"]["edge_ids"] == [0, 1]
    detail_of(await cloud.admin("POST", "/api/v1/runs", json=small_config(selection={"sites": {"region": "us"}})),
              422, "no online site", "offline: ['paris']")


async def test_admission_counts_the_connected_devices_only(cloud: Cloud):
    """Devices gone offline would leave the admitted run without anyone to train it."""
    app = cloud.app.state
    await report(cloud, 0, "lyon", report_s=60, devices=3, states={"offline": 3})
    run_id = await cloud.create_run(small_config(selection={"min_devices": 2}))
    await cloud.action(run_id, "start")
    await sites_service.admit_waiting(store=app.store, orchestrator=app.orchestrator, audit=audit_of(app))
    assert (await cloud.info(run_id))["status"] == "waiting"
    await report(cloud, 0, "lyon", report_s=60, devices=3, states={"offline": 1, "idle": 1, "training": 1})
    await sites_service.admit_waiting(store=app.store, orchestrator=app.orchestrator, audit=audit_of(app))
    assert (await cloud.info(run_id))["status"] == "running"


async def test_admission_counts_the_connected_devices_the_device_selector_takes(cloud: Cloud):
    app = cloud.app.state
    await report(cloud, 0, "lyon", report_s=60, devices=5, states={"idle": 5},
                 label_sets=[{"labels": {"kind": "csv"}, "devices": 3}, {"labels": {"kind": "npz"}, "devices": 1},
                             {"labels": {}, "devices": 1}])
    run_id = await cloud.create_run(small_config(selection={"min_devices": 2, "devices": {"kind": "npz"}}))
    await cloud.action(run_id, "start")
    await sites_service.admit_waiting(store=app.store, orchestrator=app.orchestrator, audit=audit_of(app))
    assert (await cloud.info(run_id))["status"] == "waiting"  # 1 of the 5 connected devices is of kind npz
    await report(cloud, 0, "lyon", report_s=60, devices=5, states={"idle": 5},
                 label_sets=[{"labels": {"kind": "npz", "zone": "a"}, "devices": 2}])
    await sites_service.admit_waiting(store=app.store, orchestrator=app.orchestrator, audit=audit_of(app))
    assert (await cloud.info(run_id))["status"] == "running"


async def test_admission_counts_only_the_devices_whose_data_fits_the_run(cloud: Cloud):
    """min_devices 2 over digits (1x8x8, 10 classes): three connected devices whose data does not fit (another shape,
    a label past the classes, no training samples) do not admit it, as no edge would take them as members; two
    that fit do; devices that registered no data summary are taken, as their edge takes them."""
    app = cloud.app.state
    fit = {"samples": 1, "input_shape": [1, 8, 8], "labels": [0, 9]}
    misfits = [{**fit, "input_shape": [3, 2]}, {**fit, "labels": [0, 12]}, {**fit, "samples": 0}]
    await report(cloud, 0, "lyon", report_s=60, devices=5, states={"idle": 5},
                 label_sets=[{"labels": {}, "devices": 1, "fit": m} for m in misfits]
                 + [{"labels": {"zone": "a"}, "devices": 1, "fit": fit}])
    run_id = await cloud.create_run(small_config(selection={"min_devices": 2, "start_timeout_s": 3600}))
    await cloud.action(run_id, "start")
    await sites_service.admit_waiting(store=app.store, orchestrator=app.orchestrator, audit=audit_of(app))
    waiting = await cloud.info(run_id)  # 1 of the 4 connected devices can train it, and the run says so
    assert waiting["status"] == "waiting"
    assert waiting["reason"] == ("waiting up to 3600 s for 2 devices at its sites [0]; 1 able to train it connected "
                                 "(3 more whose data does not fit it)"), waiting
    await report(cloud, 0, "lyon", report_s=60, devices=5, states={"idle": 5},
                 label_sets=[{"labels": {}, "devices": 3, "fit": misfits[0]}, {"labels": {}, "devices": 1, "fit": fit},
                             {"labels": {"zone": "a"}, "devices": 1}])
    await sites_service.admit_waiting(store=app.store, orchestrator=app.orchestrator, audit=audit_of(app))
    admitted = await cloud.info(run_id)
    assert admitted["status"] == "running" and admitted["reason"] is None
    audit = (await cloud.admin("GET", "/api/v1/audit")).json()
    assert [a["detail"] for a in audit if a["action"] == "admit"] == [
        "2 devices able to train it connected at its sites"]


async def test_admission_counts_devices_without_a_summary_only_where_their_id_names_a_partition(cloud: Cloud):
    """Such a device trains the partition of the run's data set its id names: of ids 2-5 and 9, two are below the
    run's data.num_clients (4), as their edge would take them; a site that does not list the ids counts them all."""
    app = cloud.app.state
    await report(cloud, 0, "lyon", report_s=60, devices=5, states={"idle": 5},
                 label_sets=[{"labels": {}, "devices": 5, "ids": [[2, 5], [9, 9]]}])
    run_id = await cloud.create_run(small_config(selection={"min_devices": 3, "start_timeout_s": 3600}))
    await cloud.action(run_id, "start")
    await sites_service.admit_waiting(store=app.store, orchestrator=app.orchestrator, audit=audit_of(app))
    waiting = await cloud.info(run_id)
    assert waiting["status"] == "waiting" and "2 able to train it connected (3 more whose data does not fit it)" in \
        waiting["reason"], waiting
    await report(cloud, 0, "lyon", report_s=60, devices=5, states={"idle": 5},
                 label_sets=[{"labels": {}, "devices": 5, "ids": [[2, 5], [9, 9]]}, {"labels": {}, "devices": 1}])
    await sites_service.admit_waiting(store=app.store, orchestrator=app.orchestrator, audit=audit_of(app))
    assert (await cloud.info(run_id))["status"] == "running"


async def test_a_run_waiting_on_misfits_stops_past_its_timeout_saying_so(cloud: Cloud):
    app = cloud.app.state
    await report(cloud, 0, "lyon", report_s=60, devices=2, states={"idle": 2}, label_sets=[
        {"labels": {}, "devices": 2, "fit": {"samples": 1, "input_shape": [3, 2], "labels": [0, 1]}}])
    run_id = await cloud.create_run(small_config(selection={"min_devices": 2, "start_timeout_s": 0.1}))
    await cloud.action(run_id, "start")
    await asyncio.sleep(0.2)
    await sites_service.admit_waiting(store=app.store, orchestrator=app.orchestrator, audit=audit_of(app))
    info = await cloud.info(run_id)
    assert info["status"] == "stopped", info
    assert "0 able to train it connected (2 more whose data does not fit it)" in info["reason"]


async def test_an_admitted_run_no_site_has_a_member_for_stops_past_its_timeout_quoting_the_refusals(cloud: Cloud):
    """Admitted on a device that then left, its site refusing the one left (its data does not fit): at version 0
    past start_timeout_s, the run stops, quoting the site's refusal."""
    app = cloud.app.state
    await report(cloud, 0, "lyon", report_s=60, devices=1, states={"idle": 1},
                 label_sets=[{"labels": {}, "devices": 1}])
    run_id = await cloud.create_run(small_config(selection={"min_devices": 1, "start_timeout_s": 0.1}))
    await cloud.action(run_id, "start")
    await sites_service.admit_waiting(store=app.store, orchestrator=app.orchestrator, audit=audit_of(app))
    assert (await cloud.info(run_id))["status"] == "running"
    refusal = "refused for run 'r': its data does not fit: its samples have shape 3x2 but the run's model takes 1x8x8"
    await report(cloud, 0, "lyon", report_s=60, devices=1, states={"idle": 1}, runs=[
        {"run_id": run_id, "version": 0, "tasks": 0, "answered": 0, "failed": 0, "members": 0,
         "refused": [{"client_id": 11, "error": refusal}]}])
    await asyncio.sleep(0.2)
    await sites_service.admit_waiting(store=app.store, orchestrator=app.orchestrator, audit=audit_of(app))
    info = await cloud.info(run_id)
    assert info["status"] == "stopped", info
    assert "0 of its sites [0] have a member able to train it" in info["reason"]
    assert f"device 11 at lyon: {refusal}" in info["reason"]


def audit_of(state: Any) -> Auditor:
    return Auditor(state.store, "admission", state.settings.audit_max_entries)


async def test_a_waiting_run_says_start_as_asked_and_may_be_deleted(cloud: Cloud):
    await report(cloud, 0, "lyon", report_s=60)
    run_id = await cloud.create_run(small_config(selection={"min_devices": 5}))
    await cloud.action(run_id, "start")
    assert (await cloud.info(run_id))["status"] == "waiting"
    detail_of(await cloud.admin("POST", f"/api/v1/runs/{run_id}/start"), 409, "cannot start a run that is waiting")
    assert (await cloud.admin("DELETE", f"/api/v1/runs/{run_id}")).status_code == 204
    detail_of(await cloud.admin("GET", f"/api/v1/runs/{run_id}"), 404)


async def test_an_admin_removes_a_site_no_live_run_uses(cloud: Cloud):
    await report(cloud, 0, "lyon", report_s=60)
    await report(cloud, 1, "paris", report_s=60)
    run_id = await cloud.create_run(small_config(selection={"sites": ["paris"]}))
    await cloud.action(run_id, "start")  # waiting for its devices: it uses paris
    detail_of(await cloud.edge("DELETE", "/api/v1/sites/lyon"), 401)
    detail_of(await cloud.admin("DELETE", "/api/v1/sites/paris"), 409, run_id)
    detail_of(await cloud.admin("DELETE", "/api/v1/sites/rome"), 404, "rome")
    assert (await cloud.admin("DELETE", "/api/v1/sites/lyon")).status_code == 204
    assert [s.name for s in await sites(cloud)] == ["paris"]
    await cloud.action(run_id, "stop")
    assert (await cloud.admin("DELETE", "/api/v1/sites/paris")).status_code == 204
    assert await sites(cloud) == []
    audit = (await cloud.admin("GET", "/api/v1/audit")).json()
    assert [a["target"] for a in audit if a["action"] == "remove_site"] == ["paris", "lyon"]


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


@pytest.mark.parametrize(("method", "path", "status"), [
    ("GET", "/ui", 307), ("GET", "/ui/missing.html", 404), ("GET", "/ui/js/missing.js", 404),
    ("POST", "/ui/", 405), ("DELETE", "/ui/run.html", 405)])
async def test_the_pages_errors_and_redirects_carry_the_security_headers_too(cloud: Cloud, method: str, path: str,
                                                                             status: int):
    r = await cloud.http.request(method, path)
    assert r.status_code == status, path
    assert r.headers["x-frame-options"] == "DENY" and r.headers["x-content-type-options"] == "nosniff"
    assert "frame-ancestors 'none'" in r.headers["content-security-policy"]


@pytest.mark.parametrize("path", ["/docs", "/redoc"])
async def test_the_api_docs_are_served_with_a_policy_that_lets_their_own_scripts_run(cloud: Cloud, path: str):
    r = await cloud.http.get(path)
    assert r.status_code == 200
    assert r.headers["x-frame-options"] == "DENY" and r.headers["x-content-type-options"] == "nosniff"
    policy = dict(part.strip().split(" ", 1) for part in r.headers["content-security-policy"].split(";"))
    assert policy["default-src"] == "'none'" and policy["frame-ancestors"] == "'none'"
    assert "unsafe" not in policy["script-src"] and policy["connect-src"] == "'self'"
    # Every script the page holds inline is allowed by its hash, and every one it loads is the app's own.
    for script in re.findall(r"<script>(.*?)</script>", r.text, re.DOTALL):
        digest = base64.b64encode(hashlib.sha256(script.encode()).digest()).decode()
        assert f"'sha256-{digest}'" in policy["script-src"].split()
    assert all(src.startswith("/static/") for src in re.findall(r'<script src="([^"]+)"', r.text))
    assert (await cloud.http.get(re.findall(r'<script src="([^"]+)"', r.text)[0])).status_code == 200


def test_the_pages_build_a_runs_api_path_from_its_encoded_id_only():
    """The run page's id comes from its address (?id=), anyone's to write: written raw into a path, "../sites"
    would call another endpoint with the user's token. Every run path goes through api.js's runPath."""
    scripts = {p.name: p.read_text() for p in (STATIC / "js").glob("*.js")}
    assert 'encodeURIComponent(runId)' in scripts["api.js"].split("export const runPath", 1)[1].split("\n", 1)[0]
    for name, text in scripts.items():
        raw = re.findall(r"`/api/v1/runs/\$\{(?!encodeURIComponent\()", text)
        assert not raw, f"{name} writes a run id into an API path unencoded"
        assert "?id=${info" not in text.replace("?id=${encodeURIComponent(info", ""), name
