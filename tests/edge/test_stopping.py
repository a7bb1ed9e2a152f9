"""A stopping edge answers its clients' open long-polls at once (the process-level check is in
tests/integration/test_resilience.py)."""
from __future__ import annotations

import asyncio

import anyio
import pytest

from fl_services.edge.tasks import TaskBoard
from fl_services.shared.wire.client_edge import ClientRegistration
from tests.edge.harness import RUN_ID, CloudDouble, auth, running_edge

pytestmark = pytest.mark.anyio


async def test_close_wakes_waiting_fetches_and_answers_later_ones_at_once() -> None:
    board = TaskBoard()
    board.register(ClientRegistration(client_id=0, num_samples=1))
    waiting = asyncio.create_task(board.fetch(0, timeout=60))
    await asyncio.sleep(0.05)
    assert not waiting.done()
    await board.close()
    assert await asyncio.wait_for(waiting, timeout=1) is None
    assert await asyncio.wait_for(board.fetch(0, timeout=60), timeout=1) is None


async def test_task_long_poll_answers_204_once_the_edge_is_stopping() -> None:
    async with running_edge(long_poll_max_s=60.0) as edge:
        await edge.register(0)
        poll = asyncio.create_task(edge.http.get("/api/v1/clients/0/task", params={"timeout": 60}, headers=auth()))
        await asyncio.sleep(0.3)
        assert not poll.done()
        edge.app.state.stopping.set()
        r = await asyncio.wait_for(poll, timeout=5)
        assert r.status_code == 204


async def test_a_run_the_cloud_no_longer_names_live_leaves_health_at_once() -> None:
    """Whichever path drops the round (the end long-poll, or the state long-poll's X-FL-Live-Runs, the only
    one here: the double has no end route), /health stops naming the run: it named a stopped run until the
    next one started (test_resilience's stop test, 1 run in 8)."""
    cloud = CloudDouble()
    async with running_edge(cloud.transport()) as edge:
        await edge.register(0)  # the round waits for it (and for clients that never come)
        with anyio.fail_after(10):
            while (await edge.http.get("/health")).json()["run_id"] != RUN_ID:
                await asyncio.sleep(0.02)
        cloud.publishing = False  # the run is stopped
        with anyio.fail_after(10):
            while (await edge.http.get("/health")).json()["run_id"] is not None:
                await asyncio.sleep(0.02)
        assert not edge.app.state.round_loop.lanes
