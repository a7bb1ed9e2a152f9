"""Operations at the cloud: deleting a run (every key of it), retention of ended runs, the audit log of admin
actions with the caller's identity, and revoking one device token. Bad input is a clear 4xx that changes
nothing."""
from __future__ import annotations

import asyncio
from datetime import datetime, timedelta, timezone

import pytest

from fl_services.cloud import retention
from fl_services.cloud.audit import Auditor
from tests.cloud.harness import ADMIN_TOKEN, EDGE_TOKEN, UNKNOWN_RUN, Cloud, running_cloud
from tests.web import bearer, detail_of

pytestmark = pytest.mark.anyio


async def run_keys(cloud: Cloud, run_id: str) -> list[bytes]:
    return [key async for key in cloud.redis.scan_iter(match=f"{cloud.prefix}:run:{run_id}:*")]


async def test_deleting_a_run_removes_every_key_of_it(cloud: Cloud) -> None:
    kept = await cloud.create_run()
    run_id = await cloud.create_run()
    await cloud.action(run_id, "start")
    await cloud.register_edge(0)
    await cloud.global_state()  # the run has a global state and a meta hash at least
    await cloud.action(run_id, "stop")
    assert await run_keys(cloud, run_id)
    r = await cloud.admin("DELETE", f"/api/v1/runs/{run_id}")
    assert r.status_code == 204, r.text
    assert await run_keys(cloud, run_id) == []
    detail_of(await cloud.admin("GET", f"/api/v1/runs/{run_id}"), 404, run_id)
    listed = [info["run_id"] for info in (await cloud.admin("GET", "/api/v1/runs")).json()]
    assert listed == [kept]
    detail_of(await cloud.admin("DELETE", f"/api/v1/runs/{run_id}"), 404, run_id)  # gone: nothing to delete


@pytest.mark.parametrize("reader", ["runs", "metrics"])
async def test_a_run_deleted_while_the_runs_are_read_is_left_out(cloud: Cloud, monkeypatch: pytest.MonkeyPatch,
                                                                  reader: str) -> None:
    """Another admin or retention deletes a run between the listing of the ids and the reads of each: the list
    of runs answered 404 "unknown run" for it (138 of 148 lists while three callers deleted runs), and the
    metrics' run gauges were not read."""
    kept, deleted = await cloud.create_run(), await cloud.create_run()
    store = cloud.app.state.store
    listed = store.run_ids

    async def listed_then_deleted() -> list[str]:
        run_ids = await listed()
        await store.delete_run(deleted)
        return run_ids

    monkeypatch.setattr(store, "run_ids", listed_then_deleted)
    if reader == "runs":
        r = await cloud.admin("GET", "/api/v1/runs")
        assert r.status_code == 200, r.text
        assert [info["run_id"] for info in r.json()] == [kept]
    else:
        r = await cloud.http.get("/metrics")
        assert r.status_code == 200
        assert f'fl_cloud_global_version{{run_id="{kept}"}} 0.0' in r.text
        assert deleted not in r.text


async def test_an_active_run_cannot_be_deleted_and_bad_requests_change_nothing(cloud: Cloud) -> None:
    run_id = await cloud.create_run()
    await cloud.action(run_id, "start")
    before = await cloud.snapshot(run_id)
    detail_of(await cloud.admin("DELETE", f"/api/v1/runs/{run_id}"), 409, "running", "stop it first")
    await cloud.action(run_id, "pause")
    paused = await cloud.snapshot(run_id)
    detail_of(await cloud.admin("DELETE", f"/api/v1/runs/{run_id}"), 409, "paused")
    r = await cloud.http.delete(f"/api/v1/runs/{run_id}", headers=bearer(EDGE_TOKEN))  # not an admin token
    assert r.status_code == 401
    detail_of(await cloud.admin("DELETE", f"/api/v1/runs/{UNKNOWN_RUN}"), 404)
    after = await cloud.snapshot(run_id)
    assert before["api"][run_id][1] == after["api"][run_id][1]
    assert {k: v for k, v in paused["redis"].items() if not k.endswith(":audit")} ==\
        {k: v for k, v in after["redis"].items() if not k.endswith(":audit")}


async def test_the_audit_log_names_who_did_what(redis_url: str) -> None:
    async with running_cloud(redis_url, admin_tokens={"alice": "alice-token-0123456789"}) as cloud:
        run_id = await cloud.create_run()
        await cloud.action(run_id, "start")
        alice = bearer("alice-token-0123456789")
        assert (await cloud.http.post(f"/api/v1/runs/{run_id}/stop", headers=alice)).status_code == 200
        assert (await cloud.http.delete(f"/api/v1/runs/{run_id}", headers=alice)).status_code == 204
        r = await cloud.admin("POST", "/api/v1/tokens/revoked", json={"token_id": "0123abcd4567"})
        assert r.status_code == 201, r.text
        log = (await cloud.admin("GET", "/api/v1/audit")).json()
        assert [(e["action"], e["target"], e["actor"]) for e in log] == [
            ("revoke", "0123abcd4567", "admin"), ("delete", run_id, "alice"), ("stop", run_id, "alice"),
            ("start", run_id, "admin"), ("create", run_id, "admin")]
        assert all(e["address"] for e in log) and "fedavg" in log[-1]["detail"]
        assert len((await cloud.admin("GET", "/api/v1/audit", params={"limit": 2})).json()) == 2
        # Refused calls leave no record.
        for params in ({"limit": 0}, {"limit": "many"}, {"limit": 10**6}):
            detail_of(await cloud.admin("GET", "/api/v1/audit", params=params), 422, "limit")
        assert (await cloud.http.get("/api/v1/audit", headers=bearer("nobody"))).status_code == 401
        assert (await cloud.http.get("/api/v1/audit", headers=bearer(EDGE_TOKEN))).status_code == 401
        assert len((await cloud.admin("GET", "/api/v1/audit")).json()) == 5


async def test_the_audit_log_is_capped(redis_url: str) -> None:
    async with running_cloud(redis_url, audit_max_entries=5) as cloud:
        for _ in range(300):  # Redis trims whole nodes (about 100 entries): the log stays near its cap
            assert (await cloud.admin("POST", "/api/v1/tokens/revoked",
                                      json={"token_id": "0123abcd4567"})).status_code == 201
        assert 5 <= await cloud.redis.xlen(f"{cloud.prefix}:audit") < 300


async def test_revoking_a_device_token_lists_it_for_the_edges(cloud: Cloud) -> None:
    before = await cloud.snapshot()
    for body in ({}, {"token_id": "short"}, {"token_id": "has spaces in it"}, {"token_id": "x" * 65},
                 {"token_id": "0123abcd4567", "extra": 1}, []):
        detail_of(await cloud.admin("POST", "/api/v1/tokens/revoked", json=body), 422)
    r = await cloud.http.post("/api/v1/tokens/revoked", json={"token_id": "0123abcd4567"}, headers=bearer(EDGE_TOKEN))
    assert r.status_code == 401
    assert await cloud.snapshot() == before
    first = (await cloud.admin("POST", "/api/v1/tokens/revoked", json={"token_id": "0123abcd4567"})).json()
    again = (await cloud.admin("POST", "/api/v1/tokens/revoked", json={"token_id": "0123abcd4567"})).json()
    assert first == again  # revoked once, when first revoked
    await cloud.admin("POST", "/api/v1/tokens/revoked", json={"token_id": "client-3"})
    r = await cloud.edge("GET", "/api/v1/edges/revoked-tokens")
    assert r.status_code == 200 and r.json() == ["0123abcd4567", "client-3"]
    assert (await cloud.edge("GET", "/api/v1/edges/revoked-tokens", token=ADMIN_TOKEN)).status_code == 401
    assert [t["token_id"] for t in (await cloud.admin("GET", "/api/v1/tokens/revoked")).json()] ==\
        ["0123abcd4567", "client-3"]


def test_retention_drops_runs_ended_too_long_ago_and_beyond_the_last_n() -> None:
    at = datetime(2026, 1, 31, tzinfo=timezone.utc)
    ended = [("a", at - timedelta(days=10)), ("b", at - timedelta(days=1)), ("c", at - timedelta(days=20)),
             ("d", at - timedelta(hours=1))]
    assert retention.expired(ended, at, None, None) == []
    assert retention.expired(ended, at, 7, None) == ["c", "a"]
    assert retention.expired(ended, at, None, 1) == ["c", "a", "b"]
    assert retention.expired(ended, at, None, 0) == ["c", "a", "b", "d"]
    assert retention.expired(ended, at, 15, 3) == ["c"]


async def test_retention_deletes_ended_runs_only_and_audits_it(redis_url: str) -> None:
    async with running_cloud(redis_url) as cloud:
        store = cloud.app.state.store
        ended = []
        for _ in range(3):
            run_id = await cloud.create_run()
            await cloud.action(run_id, "stop")
            ended.append(run_id)
        created, active = await cloud.create_run(), await cloud.create_run()
        await cloud.action(active, "start")
        deleted = await retention.prune(store, None, 1, Auditor(store, "retention", 100))
        assert deleted == ended[:2]
        listed = [info["run_id"] for info in (await cloud.admin("GET", "/api/v1/runs")).json()]
        assert listed == [ended[2], created, active]
        log = (await cloud.admin("GET", "/api/v1/audit", params={"limit": 2})).json()
        assert [(e["actor"], e["action"], e["target"]) for e in log] == [("retention", "delete", ended[1]),
                                                                         ("retention", "delete", ended[0])]


async def test_the_retention_task_runs_in_the_cloud(redis_url: str) -> None:
    async with running_cloud(redis_url, retain_runs=0, retention_interval_s=0.05) as cloud:
        run_id = await cloud.create_run()
        await cloud.action(run_id, "stop")
        for _ in range(100):
            if (await cloud.admin("GET", f"/api/v1/runs/{run_id}")).status_code == 404:
                break
            await asyncio.sleep(0.05)
        detail_of(await cloud.admin("GET", f"/api/v1/runs/{run_id}"), 404)
