"""The cloud loop against run control: a run stopped while its update is computed stays as it was."""
from __future__ import annotations

import asyncio
import logging
import threading
from dataclasses import dataclass, field

import pytest

from fl_services.cloud.orchestrator import Orchestrator
from fl_services.cloud.storage.redis import Keys, RedisStore
from fl_services.shared.core.algorithms.fedavg import FedAvg
from fl_services.shared.core.config import RunConfig
from tests.cloud.harness import ADMIN_TOKEN, Cloud, contribution, running_cloud, running_run, small_config
from tests.web import bearer

pytestmark = pytest.mark.anyio


@dataclass
class HeldUpdate:
    """Cloud updates signal `started`, then wait for `release`; every commit's answer lands in `commits`."""

    started: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)
    commits: asyncio.Queue = field(default_factory=asyncio.Queue)


@pytest.fixture
def held(monkeypatch: pytest.MonkeyPatch) -> HeldUpdate:
    h = HeldUpdate()
    compute, commit = Orchestrator._update, RedisStore.commit_update

    def held_compute(*args, **kwargs):
        h.started.set()
        assert h.release.wait(30), "the test never released the update"
        return compute(*args, **kwargs)

    async def recorded_commit(self, *args, **kwargs):
        committed = await commit(self, *args, **kwargs)
        h.commits.put_nowait(committed)
        return committed

    monkeypatch.setattr(Orchestrator, "_update", staticmethod(held_compute))
    monkeypatch.setattr(RedisStore, "commit_update", recorded_commit)
    return h


@pytest.mark.parametrize("rounds", [1, 3], ids=["last-round", "mid-run"])
async def test_stop_during_an_update_publishes_nothing_and_leaves_the_next_run_active(
        cloud: Cloud, held: HeldUpdate, rounds: int) -> None:
    run_a, global_ = await running_run(cloud, small_config(rounds=rounds))
    assert (await cloud.submit(0, contribution(global_, run_a))).status_code == 202
    assert await asyncio.to_thread(held.started.wait, 10)
    await cloud.action(run_a, "stop")
    run_b = await cloud.create_run(small_config(rounds=rounds))
    await cloud.action(run_b, "start")
    held.release.set()

    assert await asyncio.wait_for(held.commits.get(), 10) is False
    a, b = await cloud.info(run_a), await cloud.info(run_b)
    assert (a["status"], a["version"], a["buffered"]) == ("stopped", 0, 1)
    assert (b["status"], b["version"]) == ("running", 0)
    assert await cloud.redis.smembers(Keys(cloud.prefix).active) == {run_b.encode()}
    poll = await cloud.edge("GET", "/api/v1/edges/0/global", params={"timeout": 0})
    assert poll.status_code == 200, "the next run must reach its edges"


async def test_an_update_under_way_at_a_pause_is_published_after_the_resume(cloud: Cloud, held: HeldUpdate) -> None:
    """A pause holds the version from its answer on: the update already computing commits nothing, its
    contribution stays buffered, and the resume publishes it (docs/decisions/pause-holds-the-version.md)."""
    run_id, global_ = await running_run(cloud, small_config(rounds=3))
    assert (await cloud.submit(0, contribution(global_, run_id))).status_code == 202
    assert await asyncio.to_thread(held.started.wait, 10)
    await cloud.action(run_id, "pause")
    held.release.set()

    assert await asyncio.wait_for(held.commits.get(), 10) is False
    info = await cloud.info(run_id)
    assert (info["status"], info["version"], info["buffered"]) == ("paused", 0, 1)
    await cloud.action(run_id, "resume")
    assert await asyncio.wait_for(held.commits.get(), 10) is True
    info = await cloud.info(run_id)
    assert (info["status"], info["version"], info["buffered"]) == ("running", 1, 0)


def test_the_algorithm_cache_keeps_the_most_recent_runs_only() -> None:
    orchestrator = Orchestrator(store=None)  # the cache never touches the store
    config = RunConfig(**small_config())
    first = orchestrator.algorithm("run-0", config)
    for k in range(1, 10):
        orchestrator.algorithm(f"run-{k}", config)
        assert orchestrator.algorithm("run-0", config) is first  # in use: kept
    assert len(orchestrator._algorithms) == 4
    assert list(orchestrator._algorithms)[-1] == "run-0"


async def test_an_update_too_large_to_store_stops_the_run(cloud: Cloud, monkeypatch: pytest.MonkeyPatch) -> None:
    """Redis drops a value over its limit, which redis-py reported as a lost WATCH: the update was then
    recomputed forever, silently. Now the run stops, and says why in the log."""
    monkeypatch.setattr(cloud.app.state.store, "max_value_bytes", 100)
    run_id, global_ = await running_run(cloud, small_config(rounds=3))
    assert (await cloud.submit(0, contribution(global_, run_id))).status_code == 202
    assert (await stopped_at_version_0(cloud, run_id)).startswith("version 1 cannot be stored: ")


async def test_a_diverged_update_is_not_published_and_stops_the_run(cloud: Cloud, monkeypatch: pytest.MonkeyPatch,
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    """A non-finite global model would make every client fail on it, and recomputing gives the same. The
    check is the shared cloud round's (shared/core/cloud_round.py), so the algorithm's own update diverges here."""
    cloud_update = FedAvg.cloud_update

    def diverged(self, *args, **kwargs):
        new_global, new_state = cloud_update(self, *args, **kwargs)
        inf = {group: {n: t.fill_(float("inf")) for n, t in tensors.items()} for group, tensors in new_global.items()}
        return inf, new_state

    monkeypatch.setattr(FedAvg, "cloud_update", diverged)
    run_id, global_ = await running_run(cloud, small_config(rounds=3))
    v0 = await cloud.http.get(f"/api/v1/runs/{run_id}/model", headers=bearer(ADMIN_TOKEN))
    with caplog.at_level(logging.ERROR, logger="fl_services.cloud.orchestrator"):
        assert (await cloud.submit(0, contribution(global_, run_id))).status_code == 202
        reason = await stopped_at_version_0(cloud, run_id)
    assert (await cloud.http.get(f"/api/v1/runs/{run_id}/model", headers=bearer(ADMIN_TOKEN))).content == v0.content
    names = "['model/linear.bias', 'model/linear.weight']"
    assert f"run {run_id} diverged: version 1 would have non-finite {names}" in caplog.text
    assert reason == f"diverged: version 1 would have non-finite {names}"


async def stopped_at_version_0(cloud: Cloud, run_id: str) -> str:
    """Waits for the run to stop at version 0; its reason (what fedctl and the dashboard show)."""
    for _ in range(200):
        if (await cloud.info(run_id))["status"] == "stopped":
            break
        await asyncio.sleep(0.05)
    info = await cloud.info(run_id)
    assert (info["status"], info["version"]) == ("stopped", 0)
    return info["reason"]


async def test_a_run_whose_update_keeps_failing_is_stopped_and_the_others_go_on(
        redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """An update failing deterministically (an outside probe: a ZeroDivisionError in the privacy accountant)
    was retried every second for ever, the run 'running' with a traceback a second."""
    compute = Orchestrator._update

    def failing_for_a(algorithm, global_blob, *args, **kwargs):
        if b"doomed" in global_blob[:4096]:  # run a's name is in its global state's header
            raise ZeroDivisionError("float division by zero")
        return compute(algorithm, global_blob, *args, **kwargs)

    monkeypatch.setattr(Orchestrator, "_update", staticmethod(failing_for_a))
    async with running_cloud(redis_url, max_update_failures=3) as cloud:
        run_a, global_a = await running_run(cloud, small_config(rounds=3, name="doomed"))
        run_b = await cloud.create_run(small_config(rounds=3))
        await cloud.action(run_b, "start")
        assert (await cloud.submit(0, contribution(global_a, run_a))).status_code == 202
        for _ in range(200):  # three failed updates, a second apart
            if (await cloud.info(run_a))["status"] == "stopped":
                break
            await asyncio.sleep(0.05)
        a = await cloud.info(run_a)
        assert (a["status"], a["version"], a["buffered"]) == ("stopped", 0, 1)
        assert a["reason"] == ("its cloud update failed 3 times in a row, its buffer kept "
                               "(ZeroDivisionError: float division by zero)")
        global_b, header = await cloud.global_state(0)  # the other run, active all along, still trains
        assert header.run_id == run_b
        assert (await cloud.submit(0, contribution(global_b, run_b))).status_code == 202
        for _ in range(100):
            if (await cloud.info(run_b))["version"] == 1:
                break
            await asyncio.sleep(0.05)
        assert (await cloud.info(run_b))["status"] == "running" and (await cloud.info(run_b))["version"] == 1
