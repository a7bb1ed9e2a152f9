"""The long-poll wait: answers at the notify that makes the check true, or with the last value at the deadline."""
from __future__ import annotations

import asyncio
import time

import pytest

from fl_services.shared.server.longpoll import Announcer, wait_until

pytestmark = pytest.mark.anyio


async def notify(condition: asyncio.Condition) -> None:
    async with condition:
        condition.notify_all()


async def test_answers_at_the_notify_that_makes_the_check_true():
    condition, box = asyncio.Condition(), []
    waiting = asyncio.create_task(wait_until(condition, lambda: box[-1] if box else None, timeout=10))
    await asyncio.sleep(0.05)
    await notify(condition)  # a change that does not satisfy the check: it keeps waiting
    await asyncio.sleep(0.05)
    assert not waiting.done()
    started = time.monotonic()
    box.append("task")
    await notify(condition)
    assert await asyncio.wait_for(waiting, 1) == "task"
    assert time.monotonic() - started < 0.5


async def test_returns_the_last_value_at_the_deadline():
    condition = asyncio.Condition()
    started = time.monotonic()
    assert await wait_until(condition, lambda: [], timeout=0.2) == []
    assert 0.2 <= time.monotonic() - started < 1.0
    started = time.monotonic()
    assert await wait_until(condition, lambda: 0, timeout=0) == 0  # no wait at all
    assert await wait_until(condition, lambda: "ready", timeout=0) == "ready"
    assert time.monotonic() - started < 1.0  # at once: a timeout of 0 read as "no deadline" would wait for ever


async def test_an_awaiting_check_is_looked_at_again_every_recheck_without_a_notify():
    """As for a version another process published to Redis: nothing notifies this process."""
    condition, calls = asyncio.Condition(), []

    async def check() -> str | None:
        calls.append(time.monotonic())
        await asyncio.sleep(0)
        return "published" if len(calls) == 3 else None

    started = time.monotonic()
    assert await wait_until(condition, check, timeout=5, recheck_s=0.1) == "published"
    assert 0.2 <= time.monotonic() - started < 1.0
    assert await wait_until(condition, check, timeout=0.25, recheck_s=0.1) is None  # deadline: the last value
    assert 5 <= len(calls) <= 7  # 3 before; then at 0, 0.1, 0.2 and the deadline (fewer on a busy machine)


async def test_many_waiters_each_see_a_notify_that_comes_while_others_hold_the_lock():
    condition, ready = asyncio.Condition(), set()
    waiters = [asyncio.create_task(wait_until(condition, lambda k=k: k in ready, timeout=5)) for k in range(20)]
    await asyncio.sleep(0.05)
    for k in range(20):  # one notify per waiter, back to back: woken waiters queue on the lock meanwhile
        ready.add(k)
        await notify(condition)
    assert await asyncio.wait_for(asyncio.gather(*waiters), 1) == [True] * 20


async def test_an_announcement_made_while_an_awaiting_check_is_suspended_is_not_missed():
    """The check awaits Redis; the stop is announced meanwhile. Without the count, the waiter slept until its
    deadline: the edge heard of a stopped run 20-30 s late (test_resilience failed 2 of 7 runs)."""
    announcer, stopped = Announcer(), []

    async def check() -> bool:
        answer = bool(stopped)
        if not stopped:  # read "running" from Redis; the stop lands before the read returns
            stopped.append(True)
            await announcer.notify_all()
        await asyncio.sleep(0)
        return answer

    started = time.monotonic()
    assert await wait_until(announcer, check, timeout=5) is True
    assert time.monotonic() - started < 1.0
