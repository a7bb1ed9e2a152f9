"""The dashboard's operator views in a real browser (headless Chromium driven by Playwright) against two real sites:
the topology page shows the cloud, both sites and their devices; a run's page shows its sites and the device that
failed every round with its reason; a run is deleted from its page after a confirmation. Every page runs under the
cloud's Content-Security-Policy with no console error (a violation is one) and nothing requested elsewhere."""
from __future__ import annotations

import re
from collections.abc import Iterator
from urllib.parse import urlsplit

import numpy as np
import pytest
from playwright.sync_api import Browser, expect

from fl_services.shared.core.config import RunConfig
from fl_services.shared.core.reports import RunStatus
from tests.integration.test_dashboard_browser import Watched, screenshot, sign_in
from tests.integration.test_dashboard_browser import browser as browser  # noqa: PLC0414 (the fixture, shared)
from tests.integration.topology import federation, run

pytestmark = pytest.mark.slow

SITES = {0: {"FL_EDGE_NAME": "site-a", "FL_EDGE_LABELS": "region=eu", "FL_EDGE_SITE_REPORT_S": "0.5"},
         1: {"FL_EDGE_NAME": "site-b", "FL_EDGE_LABELS": "region=us", "FL_EDGE_SITE_REPORT_S": "0.5"}}
# The run's task: (2, 3) samples, 3 classes (tests.shared.user_factories:as_dict); client 2's own file holds 3x2.
CONFIG = RunConfig(name="two-sites", rounds=2, model={"name": "logreg"},
                   data={"dataset": "tests.shared.user_factories:as_dict", "options": {"num_clients": 4},
                         "partition": "file", "num_clients": 4},
                   topology={"num_edges": 2, "buffer_size": 2},
                   policy={"deadline_s": 60, "min_fraction": 0.5, "max_retries": 0})


@pytest.fixture(scope="module")
def sites(tmp_path_factory) -> Iterator:
    path = tmp_path_factory.mktemp("device-data") / "transposed.npz"
    x = np.random.default_rng(1).normal(size=(30, 3, 2)).astype(np.float32)
    np.savez(path, x=x, y=(x[:, 0, 0] > 0).astype(np.int64))
    # Client processes by start order: 0 (client 0) and 1 (client 2) at site-a, 2 (client 1) and 3 (client 3) at
    # site-b; client 2 trains on its own file, whose samples the run's model does not take.
    with federation(tmp_path_factory, num_clients=4, num_edges=2, procs_per_edge=2, edge_env=SITES,
                    client_env={1: {"FL_CLIENT_DATA": f"npz:{path}"}}) as (topo, api):
        yield topo, api


@pytest.fixture
def watched(browser: Browser, sites) -> Iterator[Watched]:
    topo, _ = sites
    w = Watched(browser, topo.cloud_url)
    yield w
    w.close()


def test_the_topology_shows_the_cloud_both_sites_and_their_devices(sites, watched):
    topo, api = sites
    page = watched.page
    page.goto(topo.cloud_url + "/ui/topology.html")
    expect(page.locator("#login-hint")).to_contain_text("FL_CLOUD_ADMIN_TOKEN")  # what to enter, before signing in
    sign_in(page, topo.admin_token)
    for name, edge_id, clients in (("site-a", 0, ["0", "2"]), ("site-b", 1, ["1", "3"])):
        site = page.locator(f".site[data-site='{name}']")
        expect(site).to_have_attribute("data-status", "online")
        expect(site.locator("h3")).to_contain_text(f"edge {edge_id}")
        expect(site.locator(".connected")).to_have_text("2 / 2")
        expect(site.locator("tr[data-device]")).to_have_count(2)
        assert sorted(site.locator("tr[data-device]").evaluate_all("rows => rows.map(r => r.dataset.device)")) == \
            clients
        expect(site.locator(".states")).to_have_text("idle 2")
    assert [(s.name, s.status, s.devices) for s in api.sites()] == [("site-a", "online", 2), ("site-b", "online", 2)]
    screenshot(page, "dashboard-topology.png")
    # A narrow window: the devices table scrolls in its box instead of being cut off.
    page.set_viewport_size({"width": 480, "height": 900})
    box = page.locator(".site[data-site='site-a'] .scroll")
    assert box.evaluate("b => getComputedStyle(b).overflowX") == "auto"
    assert box.evaluate("b => b.scrollWidth > b.clientWidth")
    watched.assert_clean()


def test_the_run_page_shows_its_sites_and_the_device_that_failed_with_its_reason(sites, watched):
    topo, api = sites
    info, history, _ = run(api, CONFIG)
    assert [[(f.client_id, f.edge_id) for f in h.failed_clients] for h in history] == [[(2, 0)], [(2, 0)]]
    page = watched.page
    page.goto(f"{topo.cloud_url}/ui/run.html?id={info.run_id}")
    sign_in(page, topo.admin_token)
    expect(page.locator("#live")).to_have_text("ended")
    failed = page.locator("#failed-devices tbody tr")
    expect(failed).to_have_count(1)
    cells = failed.first.locator("td")
    expect(cells.nth(0)).to_have_text("2")
    expect(cells.nth(1)).to_have_text("site-a")
    expect(cells.nth(2)).to_have_text("2")  # failed both rounds
    expect(cells.nth(4)).to_have_text("misfit")
    expect(cells.nth(5)).to_contain_text("DataMisfit")
    expect(cells.nth(5)).to_contain_text("its samples have shape 3x2 but the run's model takes 2x3")
    expect(page.locator("#run-sites tbody tr")).to_have_count(2)
    expect(page.locator("#run-sites tbody tr[data-site='site-b']")).to_be_visible()
    expect(page.locator("#devices-verdict")).to_be_hidden()  # two of the devices trained
    expect(page.locator("#energy-chart")).to_be_hidden()  # not a DVFS run
    screenshot(page, "dashboard-run-sites.png")
    watched.assert_clean()


def test_a_run_is_deleted_from_its_page_once_confirmed(sites, watched):
    topo, api = sites
    run_id = api.create_run(CONFIG.model_copy(update={"name": "to-delete"})).run_id
    page = watched.page
    page.goto(f"{topo.cloud_url}/ui/run.html?id={run_id}")
    sign_in(page, topo.admin_token)
    expect(page.locator("#status")).to_have_text("created")
    asked: list[str] = []
    page.once("dialog", lambda d: (asked.append(d.message), d.dismiss()))
    page.locator("[data-action=delete]").click()
    expect(page.locator("#status")).to_have_text("created")
    assert asked and run_id in asked[0] and "cannot be undone" in asked[0]
    assert api.run(run_id).status == RunStatus.created  # dismissed: nothing deleted
    page.once("dialog", lambda d: d.accept())
    page.locator("[data-action=delete]").click()
    page.wait_for_url(re.compile(r"/ui/$"))
    expect(page.locator("#runs")).to_be_visible()
    expect(page.locator(f"#runs tr[data-run='{run_id}']")).to_have_count(0)
    assert run_id not in [r.run_id for r in api.runs()]
    # From the list too: the row goes, and the run with it.
    listed = api.create_run(CONFIG.model_copy(update={"name": "to-delete-from-the-list"})).run_id
    row = page.locator(f"#runs tr[data-run='{listed}']")
    expect(row).to_have_attribute("data-status", "created")
    page.once("dialog", lambda d: d.accept())
    row.locator("[data-action=delete]").click()
    expect(row).to_have_count(0)
    assert listed not in [r.run_id for r in api.runs()]
    watched.assert_clean()


def test_the_api_docs_link_back_to_the_dashboard(sites, watched):
    topo, _ = sites
    page = watched.page
    page.goto(topo.cloud_url + "/docs")
    with page.expect_popup() as opened:  # Swagger UI opens the description's links in a new tab
        page.locator(".swagger-ui .info a", has_text="topology").click()
    dashboard = opened.value
    dashboard.wait_for_load_state()
    assert urlsplit(dashboard.url).path == "/ui/topology.html"
    expect(dashboard.get_by_label("Admin token")).to_be_visible()
    watched.assert_clean()
