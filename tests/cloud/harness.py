"""An in-process cloud on a real Redis for the endpoint tests: the app, its lifespan, and message builders."""
from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import anyio
import httpx
import redis.asyncio as aioredis
import torch

from fl_services.cloud.app import create_app
from fl_services.cloud.config import CloudSettings
from fl_services.shared.core.config import RunConfig
from fl_services.shared.core.reports import ClientParticipation, EdgeContributionHeader
from fl_services.shared.core.tensors import Tensors, decode, encode
from fl_services.shared.wire.edge_cloud import GlobalStateHeader
from fl_services.shared.wire.protocol import SAFETENSORS
from tests.web import bearer

ADMIN_TOKEN = "test-admin-token"
EDGE_TOKEN = "test-edge-token"
UNKNOWN_RUN = "0123456789ab"



def small_config(**overrides: Any) -> dict[str, Any]:
    base = RunConfig(model={"name": "logreg"}, data={"dataset": "digits", "num_clients": 4}, rounds=2)
    return {**base.model_dump(mode="json"), **overrides}


def two_edge_config() -> dict[str, Any]:
    # Synchronous FedAvg aggregates once both edges sent: one contribution stays in the buffer.
    return small_config(topology={"num_edges": 2, "buffer_size": 2})


class Cloud:
    def __init__(self, app, http: httpx.AsyncClient, redis: aioredis.Redis, prefix: str):
        self.app, self.http, self.redis, self.prefix = app, http, redis, prefix

    # ---- control API ---------------------------------------------------------------------------
    async def admin(self, method: str, url: str, **kwargs: Any) -> httpx.Response:
        headers = {**bearer(ADMIN_TOKEN), **kwargs.pop("headers", {})}
        return await self.http.request(method, url, headers=headers, **kwargs)

    async def create_run(self, config: dict[str, Any] | None = None) -> str:
        r = await self.admin("POST", "/api/v1/runs", json=config or small_config())
        assert r.status_code == 201, r.text
        return r.json()["run_id"]

    async def action(self, run_id: str, action: str) -> None:
        r = await self.admin("POST", f"/api/v1/runs/{run_id}/{action}")
        assert r.status_code == 200, r.text

    async def info(self, run_id: str) -> dict[str, Any]:
        r = await self.admin("GET", f"/api/v1/runs/{run_id}")
        assert r.status_code == 200, r.text
        return r.json()

    async def wait_version(self, run_id: str, version: int, timeout_s: float = 30.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while True:
            info = await self.info(run_id)
            if info["version"] >= version:
                return info
            assert time.monotonic() < deadline, f"run {run_id} stuck at version {info['version']}"
            await anyio.sleep(0.05)

    async def history(self, run_id: str) -> list[dict[str, Any]]:
        r = await self.admin("GET", f"/api/v1/runs/{run_id}/history")
        assert r.status_code == 200, r.text
        return r.json()

    async def wait_evaluated(self, run_id: str, timeout_s: float = 30.0) -> list[dict[str, Any]]:
        """The history once every record has its evaluation (the cloud evaluates a version after publishing it)."""
        deadline = time.monotonic() + timeout_s
        while True:
            records = await self.history(run_id)
            if not any(r["test_accuracy"] is None for r in records):
                return records
            assert time.monotonic() < deadline, f"run {run_id}: a record stayed unevaluated"
            await anyio.sleep(0.05)

    # ---- edge API ------------------------------------------------------------------------------
    async def edge(self, method: str, url: str, token: str | None = EDGE_TOKEN, **kwargs: Any) -> httpx.Response:
        headers = {**bearer(token), **kwargs.pop("headers", {})}
        return await self.http.request(method, url, headers=headers, **kwargs)

    async def register_edge(self, edge_id: int) -> None:
        r = await self.edge("POST", "/api/v1/edges", json={"edge_id": edge_id})
        assert r.status_code == 200, r.text

    async def global_state(self, edge_id: int = 0) -> tuple[Tensors, GlobalStateHeader]:
        """The active run's global state, fetched exactly like an edge does."""
        r = await self.edge("GET", f"/api/v1/edges/{edge_id}/global", params={"timeout": 0})
        assert r.status_code == 200, (r.status_code, r.text)
        return decode(r.content, GlobalStateHeader)

    async def submit(self, edge_id: int, body: Any, token: str | None = EDGE_TOKEN,
                     headers: dict[str, str] | None = None) -> httpx.Response:
        return await self.edge("POST", f"/api/v1/edges/{edge_id}/contributions", token=token,
                               content=body, headers={"Content-Type": SAFETENSORS, **(headers or {})})

    # ---- state ---------------------------------------------------------------------------------
    async def snapshot(self, *run_ids: str) -> dict[str, Any]:
        """Every Redis key under this test's prefix with its full value, plus each run's info/history."""
        # SCAN's default COUNT of 10 took a round trip per 10 keys of the whole database, which every earlier
        # test grows; one asked to look at them all comes back at once. Types and values: a pipeline each.
        names = sorted([key async for key in self.redis.scan_iter(match=f"{self.prefix}:*", count=1_000_000)])
        async with self.redis.pipeline(transaction=False) as pipe:
            for key in names:
                pipe.type(key)
            kinds = [kind.decode() for kind in await pipe.execute()]
            for key, kind in zip(names, kinds, strict=True):
                read = {"string": pipe.get, "hash": pipe.hgetall, "list": partial(pipe.lrange, start=0, end=-1),
                        "stream": pipe.xrange, "set": pipe.smembers}.get(kind, pipe.dump)
                read(key)
            values = await pipe.execute()
        keys = {key.decode(): (kind, value) for key, kind, value in zip(names, kinds, values, strict=True)}
        api = {}
        for run_id in run_ids:
            history = await self.admin("GET", f"/api/v1/runs/{run_id}/history")
            assert history.status_code == 200, history.text
            api[run_id] = (await self.info(run_id), history.json())
        return {"redis": keys, "api": api}


@asynccontextmanager
async def running_cloud(redis_url: str, prefix: str | None = None, **settings: Any) -> AsyncIterator[Cloud]:
    """A cloud on its own key prefix, or on `prefix`: another replica of a cloud already running there."""
    prefix = prefix or f"test-{uuid.uuid4().hex}"
    app = create_app(CloudSettings(**{"redis_url": redis_url, "key_prefix": prefix, "admin_token": ADMIN_TOKEN,
                                      "edge_token": EDGE_TOKEN, "long_poll_max_s": 2.0, **settings}))
    # raise_app_exceptions=False: an unhandled product error shows up as a 500 answer, not a crash.
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    lifespan = app.router.lifespan_context(app)
    await lifespan.__aenter__()
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://test", timeout=30) as http:
            redis = aioredis.Redis.from_url(redis_url)
            try:
                yield Cloud(app, http, redis, prefix)
            finally:
                await redis.aclose()
    finally:
        await _exit_lifespan(lifespan)


async def _exit_lifespan(lifespan) -> None:
    """Leaves the cloud's lifespan; a shutdown that hangs fails the test instead of stalling the suite. (A cancel
    lost in a Redis command is the lifespan's own to repeat: shared/runtime/tasks.py.)"""
    with anyio.fail_after(10):
        await lifespan.__aexit__(None, None, None)




def zeros_like(global_: Tensors, dtype: torch.dtype = torch.float32) -> Tensors:
    """A contribution of zeros as it travels: float32 sums (Algorithm.wire_spec)."""
    return {name: torch.zeros(t.shape, dtype=dtype) for name, t in global_.items()}


def contribution_header(run_id: str, edge_id: int = 0, base_version: int = 0, key: str | None = None,
                        **overrides: Any) -> EdgeContributionHeader:
    fields = {
        "run_id": run_id, "edge_id": edge_id, "base_version": base_version,
        "idempotency_key": key or f"{run_id}:{edge_id}:{base_version}", "weight": 10.0,
        "clients": [ClientParticipation(client_id=edge_id, num_samples=10, loss=0.5)],
    }
    return EdgeContributionHeader(**{**fields, **overrides})


def contribution(global_: Tensors, run_id: str, **header: Any) -> bytes:
    return encode(zeros_like(global_), contribution_header(run_id, **header))


async def running_run(cloud: Cloud, config: dict[str, Any] | None = None,
                      edges: tuple[int, ...] = (0,)) -> tuple[str, Tensors]:
    """A started run with `edges` registered, and its version-0 global state."""
    for edge_id in edges:
        await cloud.register_edge(edge_id)
    run_id = await cloud.create_run(config)
    await cloud.action(run_id, "start")
    global_, header = await cloud.global_state(edges[0])
    assert (header.run_id, header.version) == (run_id, 0)
    return run_id, global_
