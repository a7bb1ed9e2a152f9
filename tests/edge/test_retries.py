"""An edge's contribution through a passing fault of the cloud (a 503, a dropped connection): the cloud counts
an idempotency key once, so the transport sends it again, and it arrives once."""
from __future__ import annotations

import asyncio

import httpx
import pytest

from tests.edge.harness import CONFIG, CloudDouble, answer_tasks, running_edge, until

pytestmark = pytest.mark.anyio


async def test_a_contribution_goes_through_a_restarting_cloud() -> None:
    cloud = CloudDouble(CONFIG)
    faults: list = [503, httpx.ConnectError("cloud restarting")]
    attempts = []

    async def handle(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/contributions"):
            attempts.append(request.content)
            if faults:
                answer = faults.pop(0)
                if isinstance(answer, Exception):
                    raise answer
                return httpx.Response(answer, json={"detail": "cloud restarting"})
        return await cloud.handle(request)

    async with running_edge(cloud_transport=httpx.MockTransport(handle), state_dir=None) as edge:
        clients = asyncio.create_task(answer_tasks(edge, range(CONFIG.data.num_clients)))
        try:
            await until(lambda: cloud.contributions, what="the contribution arrives")
        finally:
            clients.cancel()
    assert len(attempts) == 3 and len(set(attempts)) == 1  # the same contribution, sent again
    assert len(cloud.contributions) == 1 and cloud.contributions[0].base_version == 0
