"""A stopping cloud answers its open long-polls at once (the process-level check is in
tests/integration/test_resilience.py)."""
from __future__ import annotations

import asyncio
import time

import pytest

from tests.cloud.harness import running_cloud

pytestmark = pytest.mark.anyio


async def test_long_poll_answers_204_once_the_cloud_is_stopping(redis_url: str) -> None:
    async with running_cloud(redis_url, long_poll_max_s=60.0) as cloud:
        await cloud.register_edge(0)  # no run: the poll would wait its whole timeout
        poll = asyncio.create_task(cloud.edge("GET", "/api/v1/edges/0/global", params={"timeout": 60}))
        await asyncio.sleep(0.3)
        assert not poll.done()
        started = time.monotonic()
        cloud.app.state.stopping.set()
        r = await asyncio.wait_for(poll, timeout=5)
        assert r.status_code == 204
        assert time.monotonic() - started < 2  # at once (the stop wakes every waiter), not the 60 s asked for
