"""The long-poll wait, written once: look, and while there is nothing, wait for a notify or the deadline."""
from __future__ import annotations

import asyncio
import inspect
import math
import time
from collections.abc import Awaitable, Callable
from typing import Annotated, TypeVar

from fastapi import Depends, Query, Request

T = TypeVar("T")


class Announcer:
    """A condition whose notifications are counted, for waiters whose check awaits (Redis): a notify that
    comes while such a check is suspended would otherwise be missed until the next recheck or the deadline
    (an edge's end-of-run long-poll heard of a stop only at its timeout, 20-30 s late)."""

    def __init__(self) -> None:
        self.condition = asyncio.Condition()
        self.count = 0

    async def notify_all(self) -> None:
        async with self.condition:
            self.count += 1
            self.condition.notify_all()


async def wait_until(condition: asyncio.Condition | Announcer, check: Callable[[], T | Awaitable[T]],
                     timeout: float, recheck_s: float = math.inf) -> T:
    """`check()`'s first truthy value, or its last value once `timeout` seconds have passed.

    `check()` is called again after every `notify_all` of `condition`, and at least every `recheck_s`
    seconds (for changes no notify announces, e.g. made by another process). It runs without the
    condition's lock, so it may await (e.g. Redis). No notify is lost while a synchronous check runs: a
    notifier needs the lock, which the waiter asks for before the notifier can run. One made while an
    awaiting check is suspended is seen at once with an `Announcer` (its count moved), and otherwise at the
    next recheck.
    """
    announcer: Announcer | None
    if isinstance(condition, Announcer):
        announcer, lock = condition, condition.condition
    else:
        announcer, lock = None, condition
    deadline = time.monotonic() + timeout
    while True:
        seen = announcer.count if announcer is not None else 0
        value = check()
        if inspect.isawaitable(value):
            value = await value
        remaining = deadline - time.monotonic()
        if value or remaining <= 0:
            return value
        async with lock:
            if announcer is not None and announcer.count != seen:
                continue  # announced while the check awaited: look again now
            try:
                async with asyncio.timeout(min(remaining, recheck_s)):
                    await lock.wait()
            except TimeoutError:
                pass


def capped_wait(request: Request, timeout: float) -> float:
    """How long a long-poll waits: what the caller asks for, at most the service's `long_poll_max_s`."""
    return min(timeout, request.app.state.settings.long_poll_max_s)


async def _poll_timeout(request: Request, timeout: float = Query(20.0, ge=0)) -> float:
    return capped_wait(request, timeout)


# A long-poll's `timeout` query parameter, capped (capped_wait).
PollTimeout = Annotated[float, Depends(_poll_timeout)]
