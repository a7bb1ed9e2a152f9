"""The routes the dashboard reads besides the control API: per-edge status against the buffer, the live
event stream of a run, and the pages it serves (the browser test drives them for real; the API docs:
tests/test_openapi.py)."""
from __future__ import annotations

import asyncio
import math
import re
import time

import pytest

from fl_services.cloud.ui.view import LiveRun
from fl_services.shared.core.reports import ClientParticipation
from fl_services.shared.wire.admin import RunEdges, RunUpdate
from tests.cloud.harness import UNKNOWN_RUN, Cloud, contribution, running_run, small_config, two_edge_config
from tests.web import detail_of

pytestmark = pytest.mark.anyio


def reporting(edge_id: int, accuracy: float) -> dict:
    return {"clients": [ClientParticipation(client_id=edge_id, num_samples=10, loss=0.5,
                                            metrics={"accuracy": accuracy})]}


async def edges(cloud: Cloud, run_id: str) -> RunEdges:
    r = await cloud.admin("GET", f"/api/v1/runs/{run_id}/edges")
    assert r.status_code == 200, r.text
    return RunEdges.model_validate_json(r.content)


async def test_edges_show_a_waiting_contribution_then_the_consumed_ones(cloud: Cloud):
    run_id, global_ = await running_run(cloud, two_edge_config(), edges=(0, 1))
    before = await edges(cloud, run_id)
    assert (before.buffer_size, before.buffered, before.version) == (2, 0, 0)
    assert [(e.edge_id, e.registered, e.waiting, e.base_version, e.consumed) for e in before.edges] ==\
        [(0, True, False, None, 0), (1, True, False, None, 0)]

    r = await cloud.submit(0, contribution(global_, run_id, edge_id=0))
    assert r.status_code == 202, r.text
    waiting = await edges(cloud, run_id)
    assert waiting.buffered == 1
    edge0, edge1 = waiting.edges
    assert (edge0.waiting, edge0.base_version, edge0.staleness, edge0.consumed_in) == (True, 0, 0, None)
    assert edge0.received_at is not None
    assert (edge1.waiting, edge1.base_version, edge1.received_at) == (False, None, None)

    r = await cloud.submit(1, contribution(global_, run_id, edge_id=1))
    assert r.status_code == 202, r.text
    await cloud.wait_version(run_id, 1)
    consumed = await edges(cloud, run_id)
    assert (consumed.version, consumed.buffered) == (1, 0)
    assert [(e.waiting, e.base_version, e.staleness, e.consumed_in, e.consumed) for e in consumed.edges] ==\
        [(False, 0, 0, 1, 1), (False, 0, 0, 1, 1)]


async def test_an_edge_of_the_run_that_never_registered_is_shown_as_such(cloud: Cloud):
    run_id, _ = await running_run(cloud, two_edge_config(), edges=(0,))
    assert [(e.edge_id, e.registered) for e in (await edges(cloud, run_id)).edges] == [(0, True), (1, False)]


@pytest.mark.parametrize("path", ["edges", "events"])
async def test_the_dashboard_routes_refuse_a_missing_token_and_an_unknown_run(cloud: Cloud, path: str):
    run_id = await cloud.create_run()
    r = await cloud.http.get(f"/api/v1/runs/{run_id}/{path}")
    detail_of(r, 401, "missing bearer token")
    r = await cloud.http.get(f"/api/v1/runs/{run_id}/{path}", headers={"Authorization": "Bearer wrong"})
    detail_of(r, 401, "invalid bearer token")
    detail_of(await cloud.admin("GET", f"/api/v1/runs/{UNKNOWN_RUN}/{path}"), 404, UNKNOWN_RUN)


def parse_events(text: str) -> list[tuple[str, str]]:
    events = []
    for block in text.strip().split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.split("\n") if not line.startswith(":"))
        events.append((fields["event"], fields["data"]))
    return events


async def test_the_stream_of_an_ended_run_sends_its_final_state_with_the_history_and_ends(cloud: Cloud):
    run_id, global_ = await running_run(cloud, small_config(rounds=5))
    r = await cloud.submit(0, contribution(global_, run_id, edge_id=0, **reporting(0, 0.75)))
    assert r.status_code == 202, r.text
    await cloud.wait_version(run_id, 1)
    await cloud.action(run_id, "stop")
    r = await cloud.admin("GET", f"/api/v1/runs/{run_id}/events")  # returns only because the stream ends
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/event-stream")
    [(name, data)] = parse_events(r.text)
    update = RunUpdate.model_validate_json(data)
    assert name == "update" and update.info.status.value == "stopped" and update.info.version == 1
    assert [h.version for h in update.rounds] == [1]
    assert update.edges.edges[0].consumed_in == 1
    assert update.groups == {"all": {"accuracy": (0.75, 0.0)}}


async def test_a_live_run_updates_only_on_change_and_sends_each_round_once(cloud: Cloud):
    run_id, global_ = await running_run(cloud, two_edge_config(), edges=(0, 1))
    live = LiveRun(cloud.app.state.store, run_id)
    first = await live.update()
    assert first.rounds == [] and first.info.version == 0
    assert await live.update() is None  # nothing changed
    r = await cloud.submit(0, contribution(global_, run_id, edge_id=0))
    assert r.status_code == 202, r.text
    buffered = await live.update()  # a contribution entering the buffer is a change, with no new version
    assert buffered.rounds == [] and buffered.edges.buffered == 1 and buffered.edges.edges[0].waiting
    r = await cloud.submit(1, contribution(global_, run_id, edge_id=1))
    assert r.status_code == 202, r.text
    await cloud.wait_version(run_id, 1)
    await cloud.wait_evaluated(run_id)  # published first, evaluated after: one round, sent once here
    updated = await live.update()
    assert [h.version for h in updated.rounds] == [1] and updated.info.version == 1
    assert await live.update() is None
    await cloud.action(run_id, "pause")
    paused = await live.update()
    assert paused.rounds == [] and paused.info.status.value == "paused"


async def test_root_redirects_to_the_dashboard_whose_pages_and_assets_are_served_here(cloud: Cloud):
    r = await cloud.http.get("/")
    assert r.status_code == 307 and r.headers["location"] == "/ui/"
    for page in ("/ui/", "/ui/run.html", "/ui/topology.html"):
        r = await cloud.http.get(page)
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
        for ref in re.findall(r'(?:src|href)="([^"]+)"', r.text):
            assert "//" not in ref, ref  # nothing from another host
            asset = await cloud.http.get(f"/ui/{ref}" if not ref.startswith("/") else ref)
            assert asset.status_code == 200, ref


async def test_an_open_stream_follows_the_run_and_ends_once_the_cloud_is_stopping(cloud: Cloud):
    run_id, global_ = await running_run(cloud, small_config(rounds=5))
    stream = asyncio.create_task(cloud.admin("GET", f"/api/v1/runs/{run_id}/events"))
    await asyncio.sleep(0.3)
    r = await cloud.submit(0, contribution(global_, run_id, edge_id=0))
    assert r.status_code == 202, r.text
    await cloud.wait_version(run_id, 1)
    await asyncio.sleep(0.8)  # one look (0.5 s) later the stream has sent version 1
    assert not stream.done()
    started = time.monotonic()
    cloud.app.state.stopping.set()
    r = await asyncio.wait_for(stream, timeout=5)
    assert time.monotonic() - started < 2  # one look, not a keepalive period or forever
    updates = [RunUpdate.model_validate_json(data) for _, data in parse_events(r.text)]
    assert updates[0].info.version == 0 and updates[-1].info.version == 1
    sent = [h for u in updates for h in u.rounds]
    # Each round sent once, or twice when the stream saw it before its evaluation was filled in.
    assert [h.version for h in sent] in ([1], [1, 1])
    assert len(sent) == 1 or (math.isnan(sent[0].test_accuracy) and not math.isnan(sent[1].test_accuracy))


async def test_an_open_stream_ends_when_its_run_is_stopped_and_deleted_between_two_looks(cloud: Cloud):
    """Stop and delete at once (fedctl, or retention right after a stop): the stream's next look found no run,
    and each open dashboard stream broke with "Exception in ASGI application" (NotFound) in the log."""
    run_id, _ = await running_run(cloud, small_config(rounds=5))
    store, state = cloud.app.state.store, cloud.app.state
    live = LiveRun(store, run_id)
    stream = live.stream(await live.update(), state.orchestrator, state.stopping)
    assert (await anext(stream)).startswith("event: update")
    await store.transition(run_id, "stop")  # no announcement: the stream learns at its next look (0.5 s)
    await store.delete_run(run_id)
    with pytest.raises(StopAsyncIteration):  # ends, where it raised NotFound
        await asyncio.wait_for(anext(stream), timeout=5)


async def test_the_cloud_loop_passes_over_a_run_deleted_since_it_listed_the_active_runs(cloud: Cloud):
    """A run stopped and deleted between the loop's listing of the active runs and its look at that run: the
    loop logged "cloud update of run ... failed" with a NotFound traceback."""
    run_id, _ = await running_run(cloud, small_config(rounds=5))
    store, orchestrator = cloud.app.state.store, cloud.app.state.orchestrator
    await store.transition(run_id, "stop")
    await store.delete_run(run_id)
    assert await orchestrator.update(run_id) is False
