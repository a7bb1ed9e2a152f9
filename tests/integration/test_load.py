"""The services under the load the configurations allow (1,000 edges on a cloud, 1,000 clients on an edge),
as real processes: a burst of registrations and 1,000 concurrent long-polls answer without a single 5xx,
/health keeps answering meanwhile, and the cloud never opens more Redis connections than its pool holds.
Bounded: each wave is at most 2,000 requests, long-polls last at most 3 s, and each test gives up after
its own time limit (the figures are printed: pytest -s).
"""
from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from collections.abc import Awaitable, Iterator
from typing import TypeVar

import httpx
import pytest
import redis.asyncio as aioredis

from fl_services.fedctl.api import CloudAPI
from fl_services.fedctl.launch import LocalTopology
from fl_services.shared.core.config import RunConfig
from tests.web import bearer, status_of

pytestmark = pytest.mark.slow
T = TypeVar("T")

CONCURRENT = 1000
LONG_POLL_S = 3.0
POOL = 32  # the cloud's Redis pool here: far fewer connections than concurrent requests
LIMIT_S = 150  # per test, on a loaded 2-core machine; on an idle one each takes well under a minute


@pytest.fixture(scope="module")
def topology(tmp_path_factory) -> Iterator[LocalTopology]:
    """Redis, a cloud and one edge (edge 0), no client processes: the test is the edges and clients."""
    env = {"FL_CLOUD_LONG_POLL_MAX_S": str(LONG_POLL_S), "FL_EDGE_LONG_POLL_MAX_S": str(LONG_POLL_S),
           "FL_CLOUD_REDIS_MAX_CONNECTIONS": str(POOL)}
    with LocalTopology(num_clients=0, num_edges=1, workdir=tmp_path_factory.mktemp("load"), extra_env=env) as topo:
        yield topo


def config(num_edges: int, num_clients: int) -> RunConfig:
    # Synchronous FedAvg waits for every edge: no round completes while the test runs.
    return RunConfig(model={"name": "logreg"}, data={"dataset": "digits", "num_clients": num_clients},
                     topology={"num_edges": num_edges, "buffer_size": num_edges}, rounds=2)


async def wave(requests: list[Awaitable[int]]) -> Counter[int]:
    """The status of every answer (0: none)."""
    return Counter(await asyncio.gather(*requests))


class Watch:
    """While a wave runs: /health's status and latency, and the most Redis connections seen at once."""

    def __init__(self, url: str, redis_url: str):
        self.url, self.redis_url = url, redis_url
        self.health: list[tuple[int, float]] = []
        self.redis_clients = 0

    async def during(self, work: Awaitable[T]) -> T:
        task = asyncio.ensure_future(work)
        redis = aioredis.Redis.from_url(self.redis_url)
        try:
            while not task.done():
                started = time.monotonic()
                self.health.append((await status_of(self.url, "GET", "/health", timeout=20),
                                    time.monotonic() - started))
                self.redis_clients = max(self.redis_clients, (await redis.info("clients"))["connected_clients"])
                await asyncio.sleep(0.2)
        finally:
            await redis.aclose()
        return await task

    def report(self) -> str:
        latencies = sorted(s for _, s in self.health)
        return (f"/health {dict(Counter(c for c, _ in self.health))}, slowest {latencies[-1]:.2f} s; "
                f"Redis connections at most {self.redis_clients}")


async def health_of(url: str) -> dict:
    async with httpx.AsyncClient() as http:
        return (await http.get(f"{url}/health")).json()


def assert_health(watch: Watch) -> None:
    """/health answered 200 each time it answered (0: not within 20 s, a figure the report gives: on a
    loaded machine it queues behind the wave)."""
    assert {status for status, _ in watch.health} <= {200, 0} and 200 in {status for status, _ in watch.health}


def test_a_thousand_edges_register_and_long_poll_the_cloud_without_a_server_error(topology):
    url, edge_auth, admin = topology.cloud_url, bearer(topology.edge_token), bearer(topology.admin_token)
    edges = range(CONCURRENT)  # edge 0 is the topology's own, which registers and polls as well
    watch = Watch(url, topology.redis_url)

    def poll(edge_id: int, query: str) -> Awaitable[int]:
        return status_of(url, "GET", f"/api/v1/edges/{edge_id}/global?timeout={LONG_POLL_S}&{query}", edge_auth)

    async def load() -> dict[str, Counter[int]]:
        waves: dict[str, Counter[int]] = {}
        # A burst of registrations.
        waves["register"] = await watch.during(wave([
            status_of(url, "POST", "/api/v1/edges", {**edge_auth, "Content-Type": "application/json"},
                      json.dumps({"edge_id": e}).encode()) for e in edges]))
        with CloudAPI(url, topology.admin_token) as api:
            run_id = api.create_run(config(CONCURRENT, CONCURRENT)).run_id
            api.action(run_id, "start")
        # Every edge fetches version 0 at once.
        waves["fetch"] = await watch.during(wave([poll(e, "after=-1") for e in edges]))

        # Every edge waits for version 1; pausing and resuming the run wakes every waiter at once, twice.
        async def control() -> Counter[int]:
            statuses = Counter[int]()
            for action in ["pause", "resume", "pause", "resume"]:
                await asyncio.sleep(0.3)
                statuses[await status_of(url, "POST", f"/api/v1/runs/{run_id}/{action}", admin)] += 1
            return statuses

        waiting = wave([poll(e, f"run_id={run_id}&after=0") for e in edges])
        waves["wait"], waves["control"] = await watch.during(asyncio.gather(waiting, control()))
        return waves

    started = time.monotonic()
    waves = asyncio.run(asyncio.wait_for(load(), LIMIT_S))
    print(f"\ncloud: {waves} in {time.monotonic() - started:.1f} s; {watch.report()}")
    assert waves["register"] == {200: CONCURRENT}
    assert waves["fetch"] == {200: CONCURRENT}
    assert waves["wait"] == {204: CONCURRENT}
    assert waves["control"] == {200: 4}
    assert_health(watch)
    # The pool's, this test's own and the topology's.
    assert watch.redis_clients <= POOL + 3, watch.redis_clients


def test_a_thousand_clients_register_and_long_poll_an_edge_without_a_server_error(topology):
    url, client_auth = topology.edges[0].address(), bearer(topology.client_token)
    clients = range(CONCURRENT)
    watch = Watch(url, topology.redis_url)

    async def load() -> dict[str, Counter[int]]:
        waves: dict[str, Counter[int]] = {}
        with CloudAPI(topology.cloud_url, topology.admin_token) as api:
            for info in api.runs():
                if info.status.value in ("running", "paused"):
                    api.action(info.run_id, "stop")
            run_id = api.create_run(config(1, CONCURRENT)).run_id
            api.action(run_id, "start")
        while (await health_of(url)).get("run_id") != run_id:  # the edge has the run: it takes each client
            await asyncio.sleep(0.2)
        waves["register"] = await watch.during(wave([
            status_of(url, "POST", "/api/v1/clients", {**client_auth, "Content-Type": "application/json"},
                      json.dumps({"client_id": k, "num_samples": 1}).encode()) for k in clients]))

        # Every client long-polls its task until it has it: the edge posts all 1,000 at once.
        async def until_task(client_id: int) -> Counter[int]:
            statuses = Counter[int]()
            while 200 not in statuses and sum(statuses.values()) < 10:
                statuses[await status_of(url, "GET", f"/api/v1/clients/{client_id}/task?timeout={LONG_POLL_S}",
                                         client_auth)] += 1
            return statuses

        waves["task"] = sum(await watch.during(asyncio.gather(*[until_task(k) for k in clients])), Counter[int]())
        return waves

    started = time.monotonic()
    waves = asyncio.run(asyncio.wait_for(load(), LIMIT_S))
    print(f"\nedge: {waves} in {time.monotonic() - started:.1f} s; {watch.report()}")
    assert waves["register"] == {200: CONCURRENT}
    assert waves["task"][200] == CONCURRENT and set(waves["task"]) <= {200, 204}, waves["task"]
    assert_health(watch)
