"""The dashboard in a real browser (headless Chromium driven by Playwright) against a real federation:
create, start, watch, pause, resume and stop a run from the pages, with no console error and no request
to any host but the cloud; both services' API docs render offline too.

The browser is Chromium's headless shell where it is installed (`./fl test` installs it as root with apt), else
Chromium itself (docs/decisions/browser-tests-in-the-headless-shell.md); FL_CHROMIUM names another.
FL_SCREENSHOTS=docs/images saves the screenshots of the two pages that docs/tutorial-first-run.md shows.
"""
from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
from playwright.sync_api import Browser, Locator, Page, expect, sync_playwright

from fl_services.shared.core.config import RunConfig
from fl_services.shared.core.reports import RunStatus
from tests.integration.topology import federation

pytestmark = pytest.mark.slow

CHROMIUM = (os.environ.get("FL_CHROMIUM") or shutil.which("chromium-headless-shell") or shutil.which("chromium")
            or shutil.which("chromium-browser"))
# Small and quick, with more rounds than any machine trains before the test stops it from the page (the
# flow pauses, resumes and stops it while it trains, however fast it goes); written as TOML, as a user may.
CONFIG_TOML = """\
name = "browser"
rounds = 100000
fraction = 1.0

[model]
name = "mlp"

[data]
dataset = "digits"
num_clients = 4

[local]
epochs = 1
batch_size = 16
lr = 0.1
"""


@pytest.fixture(scope="module")
def running(tmp_path_factory):
    with federation(tmp_path_factory, num_clients=4) as topology_and_api:
        yield topology_and_api


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    if CHROMIUM is None:
        pytest.skip("no chromium on this machine: `./fl test` installs it as root with apt; elsewhere install "
                    "your distribution's chromium-headless-shell or chromium package (or set FL_CHROMIUM to its path)")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM)
        yield browser
        browser.close()


def host(url: str) -> str | None:
    """Where a request goes: None for data: URLs (no request leaves the page); a blob: URL (ReDoc's worker)
    belongs to the origin that made it."""
    if url.startswith("data:"):
        return None
    return urlsplit(url.removeprefix("blob:")).netloc


class Watched:
    """A page whose console errors, uncaught exceptions, failed requests and requests to any host other
    than the service that serves it (the cloud, unless told) are recorded."""

    def __init__(self, browser: Browser, service_url: str):
        self.context = browser.new_context(viewport={"width": 1400, "height": 1000})
        self.page: Page = self.context.new_page()
        self.errors: list[str] = []
        self.foreign: list[str] = []
        service = urlsplit(service_url).netloc
        self.page.on("console", lambda m: m.type == "error" and self.errors.append(f"console: {m.text}"))
        self.page.on("pageerror", lambda e: self.errors.append(f"page error: {e}"))
        self.page.on("requestfailed", lambda r: self._failed(r))
        self.page.on("request", lambda r: host(r.url) not in (service, None) and self.foreign.append(r.url))

    def _failed(self, request) -> None:
        # Leaving or reloading a page aborts its open requests (its event stream, a refresh of the list):
        # the browser's doing, not a failure.
        if request.failure != "net::ERR_ABORTED":
            self.errors.append(f"request failed: {request.url} {request.failure}")

    def close(self) -> None:
        self.context.close()

    def assert_clean(self) -> None:
        assert self.errors == [], self.errors
        assert self.foreign == [], f"requests to other hosts: {self.foreign}"


@pytest.fixture
def watched(browser, running) -> Iterator[Watched]:
    topology, _ = running
    w = Watched(browser, topology.cloud_url)
    yield w
    w.close()


def sign_in(page: Page, token: str) -> None:
    page.get_by_label("Admin token").fill(token)
    page.get_by_role("button", name="Use").click()
    expect(page.locator("#app")).to_be_visible()


def watched_to_its_end(running, watched, config: RunConfig) -> tuple[str, Page]:
    """The run created, started and followed on its page until the page says it ended: its id and the page."""
    topology, api = running
    run_id = api.create_run(config).run_id
    api.action(run_id, "start")
    page = watched.page
    page.goto(f"{topology.cloud_url}/ui/run.html?id={run_id}")
    sign_in(page, topology.admin_token)
    expect(page.locator("#live")).to_have_text("ended", timeout=120_000)
    return run_id, page


def points(page: Page) -> int:
    return int(page.locator("#accuracy-chart").get_attribute("data-points") or 0)


def wait_until(page: Page, expression: str, timeout_s: float = 30) -> None:
    """Until `expression` is true in the page. Not page.wait_for_function: it compiles its predicate with eval,
    which the dashboard's Content-Security-Policy refuses (page.evaluate goes through the debugging protocol)."""
    deadline = time.monotonic() + timeout_s
    while not page.evaluate(expression):
        assert time.monotonic() < deadline, f"not true after {timeout_s} s: {expression}"
        page.wait_for_timeout(100)


def wait_points(page: Page, at_least: int, timeout_s: float = 120) -> int:
    wait_until(page, f"Number(document.querySelector('#accuracy-chart').dataset.points || 0) >= {at_least}",
               timeout_s)
    return points(page)


def click_across_a_redraw(page: Page, button: Locator, region: str) -> None:
    """Presses the button, holds it until the page has redrawn `region` (a list's refresh, a stream's update), then
    releases it: a user's click while the page updates, which a button rebuilt by the redraw would lose."""
    page.evaluate("""(selector) => {
        window.redraws = 0;
        new MutationObserver(() => { window.redraws += 1; })
            .observe(document.querySelector(selector), { childList: true, subtree: true });
    }""", region)
    box = button.bounding_box()
    assert box is not None
    page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    page.mouse.down()
    page.evaluate("window.redraws = 0")  # counted from here: a redraw while it is held
    wait_until(page, "window.redraws > 0")
    page.mouse.up()


def screenshot(page: Page, name: str) -> None:
    folder = os.environ.get("FL_SCREENSHOTS")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(folder) / name), full_page=True)


def test_a_run_is_created_started_watched_paused_resumed_and_stopped_from_the_pages(running, watched):
    topology, api = running
    page = watched.page
    started = time.monotonic()
    page.goto(topology.cloud_url + "/")
    assert urlsplit(page.url).path == "/ui/"  # / redirects to the dashboard
    sign_in(page, topology.admin_token)

    page.locator("#create textarea").fill(CONFIG_TOML)
    page.get_by_role("button", name="Create").click()
    row = page.locator("#runs tbody tr").first
    expect(row).to_have_attribute("data-status", "created")
    run_id = row.get_attribute("data-run")
    assert api.run(run_id).config.rounds == 100000 and api.run(run_id).config.model.name == "mlp"
    click_across_a_redraw(page, row.locator("[data-action=start]"), "#runs tbody")  # the list refreshes every 2 s
    expect(row).to_have_attribute("data-status", "running")

    row.get_by_role("link", name=run_id).click()
    expect(page.locator("#run-id")).to_have_text(run_id)
    before = wait_points(page, 2)  # the chart gains points while it trains, with no reload
    click_across_a_redraw(page, page.locator("[data-action=pause]"), "#history tbody")  # a round's update
    expect(page.locator("#status")).to_have_text("paused")
    assert api.run(run_id).status == RunStatus.paused
    time.sleep(1.0)  # an update already buffered when we paused may still land
    held = api.run(run_id).version
    time.sleep(1.5)
    assert api.run(run_id).version == held < 100000
    wait_until(page, f"Number(document.querySelector('#accuracy-chart').dataset.points) === {held}")

    page.locator("[data-action=resume]").click()
    expect(page.locator("#status")).to_have_text("running")
    after = wait_points(page, held + 2)
    assert after > before
    # The page shows what the API says: the history, the edge and the buffer against B.
    # Rounds keep arriving: the table and the chart are compared in one look, not a count read before.
    wait_until(page, "document.querySelectorAll('#history tbody tr').length === "
               "Number(document.querySelector('#accuracy-chart').dataset.points)")
    expect(page.locator("#edges tbody tr")).to_have_count(1)
    expect(page.locator("#edges tbody tr").first.locator("td").nth(1)).to_have_text("yes")
    expect(page.locator("#buffer")).to_contain_text("/ B = 1")
    expect(page.locator("#clients tbody tr")).to_have_count(4)
    screenshot(page, "dashboard-run.png")

    page.get_by_role("link", name="Runs").click()
    row = page.locator(f"#runs tr[data-run='{run_id}']")
    expect(row).to_have_attribute("data-status", "running")
    screenshot(page, "dashboard-runs.png")
    row.get_by_role("link", name=run_id).click()
    page.locator("[data-action=stop]").click()
    expect(page.locator("#status")).to_have_text("stopped")
    expect(page.locator("#live")).to_have_text("ended")  # a stopped run's stream ends; no reconnecting
    assert api.run(run_id).status == RunStatus.stopped
    watched.assert_clean()
    print(f"browser flow took {time.monotonic() - started:.1f}s")


def test_an_invalid_config_shows_the_apis_422_detail_inline(running, watched):
    topology, api = running
    page = watched.page
    page.goto(topology.cloud_url + "/ui/")
    sign_in(page, topology.admin_token)
    bad = {"rounds": 0, "model": {"name": "nope"}}
    expected = httpx.post(f"{topology.cloud_url}/api/v1/runs", json=bad,
                          headers={"Authorization": f"Bearer {topology.admin_token}"})
    assert expected.status_code == 422
    lines = [f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in expected.json()["detail"]]
    runs_before = len(api.runs())
    page.locator("#create textarea").fill('{"rounds": 0, "model": {"name": "nope"}}')
    page.get_by_role("button", name="Create").click()
    expect(page.locator("#create-errors li")).to_have_text(lines)
    page.locator("#create textarea").fill("rounds = = 3")
    page.get_by_role("button", name="Create").click()
    expect(page.locator("#create-errors li")).to_have_count(1)
    expect(page.locator("#create-errors li")).to_contain_text("not valid TOML")
    assert len(api.runs()) == runs_before
    # The browser reports the refused request itself; nothing else may go wrong.
    assert all("status of 422" in e for e in watched.errors), watched.errors
    assert watched.foreign == []


def test_a_wrong_token_is_refused_and_the_right_one_kept_for_the_tab(running, watched):
    topology, _ = running
    page = watched.page
    page.goto(topology.cloud_url + "/ui/")
    page.get_by_label("Admin token").fill("wrong")
    page.get_by_role("button", name="Use").click()
    expect(page.locator("#login-error")).to_have_text("The cloud refused this token.")
    expect(page.locator("#app")).to_be_hidden()
    sign_in(page, topology.admin_token)
    page.reload()
    expect(page.locator("#app")).to_be_visible()  # entered once: kept for this tab
    assert topology.admin_token not in page.url
    page.get_by_role("button", name="forget").click()
    expect(page.get_by_label("Admin token")).to_be_visible()
    expect(page.locator("#app")).to_be_hidden()
    assert all("status of 401" in e for e in watched.errors), watched.errors
    assert watched.foreign == []


def test_the_run_page_shows_each_rounds_energy_the_running_total_and_each_clients_device(running, watched):
    """A DVFS run (deadline, two device profiles, emulated): the history's energy per round and cumulative, the
    total over the chart, and per client its profile, frequency per epoch and energy, as the API reports them."""
    _, api = running
    config = RunConfig(name="browser-dvfs", rounds=4, model={"name": "mlp"},
                       data={"dataset": "digits", "num_clients": 4}, local={"epochs": 2, "batch_size": 16, "lr": 0.1},
                       dvfs={"policy": "deadline", "profiles": ["rpi4", "odroid-xu4-a7"], "time_scale": 0.02})
    run_id, page = watched_to_its_end(running, watched, config)
    history = api.history(run_id)
    assert len(history) == 4 and all(h.energy_j > 0 for h in history)
    rows = page.locator("#history tbody tr")
    expect(rows).to_have_count(4)
    total = 0.0
    for h in history:  # the table lists the newest round first
        total += h.energy_j
        cells = rows.nth(len(history) - h.version).locator("td")
        expect(cells.nth(9)).to_have_text(f"{h.energy_j:.1f} J")
        expect(cells.nth(10)).to_have_text(f"{total:.1f} J")
    expect(page.locator("#energy-total")).to_have_text(f"{total:.1f} J")
    expect(page.locator("#energy-chart")).to_be_visible()
    assert page.locator("#energy-chart").get_attribute("data-points") == "4"
    last = history[-1]
    clients = page.locator("#clients tbody tr")
    expect(clients).to_have_count(4)
    for i, c in enumerate(last.clients):
        cells = clients.nth(i).locator("td")
        expect(cells.nth(5)).to_have_text(f"{c.device.profile} (deadline, emulated)")
        expect(cells.nth(6)).to_have_text(" ".join(f"{f:.2f}" for f in c.device.frequencies_ghz))
        expect(cells.nth(8)).to_have_text(f"{c.device.energy_j:.1f} J")
    # Later rounds run the fast rpi4s below their top frequency: the page shows what slowed them down.
    assert any(f < 1.5 for c in last.clients if c.device.profile == "rpi4" for f in c.device.frequencies_ghz)
    screenshot(page, "dashboard-energy.png")
    watched.assert_clean()


def test_the_run_page_shows_no_energy_for_a_run_that_models_no_device(running, watched):
    """No dvfs section: no device is modelled, so the page shows no energy figure (–) and no energy chart, and the
    clients' device columns are empty, as the API's history (energy null, no device) says."""
    _, api = running
    config = RunConfig(name="browser-no-dvfs", rounds=2, model={"name": "mlp"},
                       data={"dataset": "digits", "num_clients": 4}, local={"batch_size": 16, "lr": 0.1})
    run_id, page = watched_to_its_end(running, watched, config)
    history = api.history(run_id)
    assert len(history) == 2 and all(h.energy_j is None and all(c.device is None for c in h.clients)
                                     for h in history)
    rows = page.locator("#history tbody tr")
    expect(rows).to_have_count(2)
    for i in range(2):
        cells = rows.nth(i).locator("td")
        expect(cells.nth(9)).to_have_text("–")
        expect(cells.nth(10)).to_have_text("–")
    expect(page.locator("#energy-total")).to_have_text("–")
    expect(page.locator("#energy-chart")).to_be_hidden()
    clients = page.locator("#clients tbody tr")
    expect(clients).to_have_count(4)
    for i in range(4):
        expect(clients.nth(i).locator("td").nth(8)).to_have_text("–")
    watched.assert_clean()


def test_the_run_page_says_why_the_cloud_stopped_a_run(running, watched):
    """A run whose devices never came is stopped by the cloud past its start_timeout_s: the status line says
    stopped, followed by the reason the API gives."""
    topology, api = running
    config = RunConfig(name="browser-never-admitted", rounds=2, model={"name": "mlp"},
                       data={"dataset": "digits", "num_clients": 4},
                       selection={"sites": ["edge-0"], "min_devices": 1000, "start_timeout_s": 0.5})
    run_id = api.create_run(config).run_id
    api.action(run_id, "start")
    final = api.wait(run_id, timeout_s=120)
    assert final.status == RunStatus.stopped and final.reason is not None and "1000 devices" in final.reason
    page = watched.page
    page.goto(f"{topology.cloud_url}/ui/run.html?id={run_id}")
    sign_in(page, topology.admin_token)
    expect(page.locator("#status")).to_have_text("stopped")
    expect(page.locator("#status-reason")).to_have_text(final.reason)
    watched.assert_clean()


def test_the_run_page_shows_the_evaluation_mode_and_each_rounds_federated_accuracy(running, watched):
    """A run evaluated on the cloud's test set and on the devices' held-out splits: the page names both, and its
    history table has each round's federated accuracy (the devices', weighted by samples) as the API reports it."""
    _, api = running
    config = RunConfig(name="browser-fedeval", rounds=3, model={"name": "mlp"},
                       data={"dataset": "digits", "num_clients": 4}, local={"batch_size": 16, "lr": 0.1},
                       evaluation="both")
    run_id, page = watched_to_its_end(running, watched, config)
    expect(page.locator("#evaluation")).to_have_text("cloud test set and devices' held-out splits")
    history = api.history(run_id)
    assert [[f.version for f in h.federated] for h in history] == [[0], [1], [2]]
    rows = page.locator("#history tbody tr")
    expect(rows).to_have_count(3)
    for h in history:  # the newest round first; the federated accuracy is the last column
        cells = rows.nth(len(history) - h.version).locator("td")
        expect(cells.last).to_have_text(f"{100 * h.federated[0].accuracy:.2f}%")
    expect(page.locator("#federated-accuracy")).to_have_text(f"{100 * history[-1].federated[0].accuracy:.2f}%")
    watched.assert_clean()


@pytest.mark.parametrize("service", ["cloud", "edge"])
@pytest.mark.parametrize("path, rendered", [("/docs", ".swagger-ui .info .title"), ("/redoc", "h1")])
def test_the_api_docs_render_offline(running, browser, service, path, rendered):
    """Both services' docs, each page requesting nothing but from the service that serves it."""
    topology, _ = running
    url = topology.cloud_url if service == "cloud" else topology.edges[0].url
    watched = Watched(browser, url)
    try:
        watched.page.goto(url + path)
        expect(watched.page.locator(rendered).first).to_contain_text(f"FL {service}", timeout=30_000)
        watched.page.wait_for_load_state("networkidle")
        watched.assert_clean()
    finally:
        watched.close()
