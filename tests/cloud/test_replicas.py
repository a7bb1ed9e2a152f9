"""Several cloud replicas over one Redis: an update lease lets one replica compute each cloud update (and
another take over when the holder dies), and a long-poll on one replica learns at once, without
re-checking, of a version another replica published."""
from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator

import pytest

from fl_services.cloud.storage import now
from fl_services.cloud.storage.redis import Keys
from fl_services.shared.core.reports import RoundRecord
from fl_services.shared.core.tensors import decode
from fl_services.shared.wire.edge_cloud import GlobalStateHeader
from tests.cloud.harness import Cloud, contribution, running_cloud, running_run, small_config

pytestmark = pytest.mark.anyio


@pytest.fixture
async def replicas(redis_url: str) -> AsyncIterator[tuple[Cloud, Cloud]]:
    async with running_cloud(redis_url, replica_id="a", lease_s=1.0) as a,\
            running_cloud(redis_url, prefix=a.prefix, replica_id="b", lease_s=1.0) as b:
        yield a, b


async def test_a_long_poll_learns_of_another_replicas_version_at_once_without_rechecks(
        replicas: tuple[Cloud, Cloud]) -> None:
    a, b = replicas
    run_id, global_ = await running_run(a, small_config(rounds=3))
    looks = 0
    store = b.app.state.store
    config = store.config  # what each look of a long-poll reads of every live run (the loop reads none)

    async def counted(run: str):
        nonlocal looks
        looks += 1
        return await config(run)

    store.config = counted
    poll = asyncio.create_task(b.edge("GET", "/api/v1/edges/0/global",
                                      params={"seen": f"{run_id}:0", "timeout": 20}))
    await asyncio.sleep(1.5)
    assert not poll.done() and looks == 1, f"the waiting poll looked {looks} times in 1.5 s without news"
    published = time.monotonic()
    assert (await a.submit(0, contribution(global_, run_id))).status_code == 202  # replica a computes it
    r = await asyncio.wait_for(poll, 10)
    waited = time.monotonic() - published
    assert r.status_code == 200
    header = decode(r.content, GlobalStateHeader)[1]
    assert (header.run_id, header.version) == (run_id, 1)
    assert waited < 5, f"answered {waited:.1f} s after the contribution"
    assert [h["computed_by"] for h in (await a.admin("GET", f"/api/v1/runs/{run_id}/history")).json()] == ["a"]


async def test_long_polls_learn_of_what_a_replica_that_died_before_announcing_it_committed(redis_url: str) -> None:
    """Replica a commits and says nothing on the event channel, as when it is killed between its commit and
    its announcement: b's loop sees the version move (then the run end) at its next look and wakes the edge's
    long-polls there, which would otherwise wait for their whole timeout (600 s here)."""
    async with running_cloud(redis_url, replica_id="a", long_poll_max_s=600) as a,\
            running_cloud(redis_url, prefix=a.prefix, replica_id="b", long_poll_max_s=600) as b:
        run_id, global_ = await running_run(a, small_config(rounds=2))
        committed = asyncio.Event()

        async def dies_before_announcing() -> None:
            committed.set()

        async def never_takes_the_lease(*args: object) -> None:
            return None

        a.app.state.orchestrator.announce = dies_before_announcing
        b.app.state.store.acquire_lease = never_takes_the_lease  # a computes every update
        for version in (0, 1):  # version 1, then version 2, the last: the run ends
            committed.clear()
            poll = asyncio.create_task(
                b.edge("GET", "/api/v1/edges/0/global", params={"seen": f"{run_id}:{version}", "timeout": 600})
                if version == 0 else b.edge("GET", f"/api/v1/edges/0/runs/{run_id}/end", params={"timeout": 600}))
            await asyncio.sleep(0.2)  # the poll waits
            assert not poll.done()
            assert (await a.submit(0, contribution(global_, run_id, base_version=version))).status_code == 202
            await asyncio.wait_for(committed.wait(), 60)
            r = await asyncio.wait_for(poll, 30)  # b's loop looks every second
            assert r.status_code == 200, r.text
            if version == 0:
                header = decode(r.content, GlobalStateHeader)[1]
                assert (header.run_id, header.version) == (run_id, 1)
            else:
                assert r.json()["status"] == "finished"
        history = (await a.admin("GET", f"/api/v1/runs/{run_id}/history")).json()
        assert [h["computed_by"] for h in history] == ["a", "a"]


async def test_an_update_whose_lease_is_held_waits_and_is_taken_over_once_it_expires(
        replicas: tuple[Cloud, Cloud]) -> None:
    """A replica that died holding the lease (never released, never renewed): after its TTL another computes."""
    a, b = replicas
    run_id, global_ = await running_run(a, small_config(rounds=3))
    assert await a.app.state.store.acquire_lease(run_id, 2.0, "dead-replica") is not None
    assert (await b.submit(0, contribution(global_, run_id))).status_code == 202
    await asyncio.sleep(1.0)
    assert (await a.info(run_id))["version"] == 0, "computed while another replica held the lease"
    await a.wait_version(run_id, 1, timeout_s=10)
    history = (await a.admin("GET", f"/api/v1/runs/{run_id}/history")).json()
    assert [h["version"] for h in history] == [1] and history[0]["computed_by"] in ("a", "b")
    assert await a.redis.exists(Keys(a.prefix).lease(run_id)) == 0  # released after the commit


async def test_a_commit_under_a_lost_lease_publishes_nothing(cloud: Cloud) -> None:
    run_id, global_ = await running_run(cloud, small_config(rounds=3))
    store = cloud.app.state.store
    expired = await store.acquire_lease(run_id, 0.1, "expired-replica")
    await asyncio.sleep(0.2)
    held = await store.acquire_lease(run_id, 30.0, "another-replica")  # this cloud's loop can no longer take it
    assert expired is not None and held is not None
    assert (await cloud.submit(0, contribution(global_, run_id))).status_code == 202
    entries = await store.buffered(run_id, 1)
    before = await cloud.snapshot(run_id)
    record = RoundRecord(round=0, version=1, edges=[0], clients=[], contributions=[], train_loss=0, test_loss=0,
                         test_accuracy=0, started_at=now(), finished_at=now(), elapsed_s=0)
    assert await store.commit_update(run_id, 0, entries, b"g", b"s", record, False, lease=expired) is False
    assert await cloud.snapshot(run_id) == before
    assert await store.commit_update(run_id, 0, entries, b"g", b"s", record, False, lease=held) is True
    await store.release_lease(held)


async def test_a_renewal_that_loses_its_cancel_does_not_hold_the_update(redis_url: str) -> None:
    """A cancel that lands in a storage call can be lost there (redis-py under Python 3.11's wait_for). The
    update is computed while a renewal is under way, and that renewal loses any cancel it gets: the update is
    committed all the same, rather than waiting on a renewal that keeps the lease for ever."""
    async with running_cloud(redis_url, lease_s=3.0) as cloud:
        store, orchestrator = cloud.app.state.store, cloud.app.state.orchestrator
        extend, update = store.extend_lease, orchestrator._update
        renewal_under_way = threading.Event()

        async def loses_its_cancel(lease: object) -> None:
            await extend(lease)
            renewal_under_way.set()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(1.0)
            renewal_under_way.clear()

        def computed_during_a_renewal(*args: object) -> object:
            assert renewal_under_way.wait(30)
            return update(*args)

        store.extend_lease = loses_its_cancel
        orchestrator._update = computed_during_a_renewal
        run_id, global_ = await running_run(cloud, small_config(rounds=2))
        for version in (0, 1):
            assert (await cloud.submit(0, contribution(global_, run_id, base_version=version))).status_code == 202
            await cloud.wait_version(run_id, version + 1, timeout_s=30)
        assert await cloud.redis.exists(Keys(cloud.prefix).lease(run_id)) == 0
