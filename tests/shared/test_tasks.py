"""Background tasks ended even when a cancel is lost (shared/runtime/tasks.py)."""
from __future__ import annotations

import asyncio

import pytest

from fl_services.shared.runtime import cancel_until_done

pytestmark = pytest.mark.anyio


async def test_a_task_that_loses_cancels_is_cancelled_again_until_it_ends() -> None:
    lost = 0

    async def loses_two_cancels() -> None:
        nonlocal lost
        while True:
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                lost += 1
                if lost == 3:
                    raise

    task = asyncio.create_task(loses_two_cancels())
    await asyncio.sleep(0)
    await asyncio.wait_for(cancel_until_done([task], retry_s=0.01), 5)
    assert task.cancelled() and lost == 3


async def test_an_error_other_than_the_cancel_is_raised() -> None:
    async def fails_as_it_stops() -> None:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            raise RuntimeError("cleanup failed") from None

    task = asyncio.create_task(fails_as_it_stops())
    await asyncio.sleep(0)
    with pytest.raises(RuntimeError, match="cleanup failed"):
        await cancel_until_done([task])
