from __future__ import annotations

import asyncio

import pytest

from fl_services.fedctl.redis_server import free_port
from fl_services.shared.wire.admin import CloudHealth
from tests.cloud.harness import Cloud, running_cloud

pytestmark = pytest.mark.anyio


async def test_health_needs_no_token_and_says_redis_answered(cloud: Cloud) -> None:
    r = await cloud.http.get("/health")
    assert r.status_code == 200
    assert CloudHealth.model_validate_json(r.content) == CloudHealth()


async def test_without_redis_the_cloud_answers_503_not_500() -> None:
    # Nothing listens on the port: every read of the store fails to connect.
    async with running_cloud(f"redis://127.0.0.1:{free_port()}/0") as cloud:
        for path in ("/health", "/api/v1/runs", "/api/v1/runs/0123456789ab/edges"):
            r = await cloud.admin("GET", path)
            assert r.status_code == 503, (path, r.status_code, r.text)
            assert "connect" in r.json()["detail"].lower()
        r = await cloud.http.get("/metrics")  # the counters still, without the gauges Redis would give
        assert r.status_code == 200 and "fl_http_request_duration_seconds" in r.text


async def test_every_redis_connection_busy_waits_then_answers_503_not_500(redis_url: str) -> None:
    # redis-py's default pool raised at once past its 100 connections: 500s above ~100 concurrent requests.
    async with running_cloud(redis_url, redis_max_connections=2, redis_pool_timeout_s=0.5) as cloud:
        pool = cloud.app.state.store.r.connection_pool
        held = [await pool.get_connection() for _ in range(2)]
        try:
            r = await cloud.http.get("/health")
            assert r.status_code == 503, r.text
            assert "no connection available" in r.json()["detail"].lower()
            waiting = asyncio.ensure_future(cloud.http.get("/health"))  # waits for a connection...
            await asyncio.sleep(0.1)
            await pool.release(held.pop())  # ...and gets the one given back
            assert (await waiting).status_code == 200
        finally:
            for connection in held:
                await pool.release(connection)
