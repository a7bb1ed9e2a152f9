"""The long-poll wait, written once: look, and while there is nothing, wait for a notify or the deadline."""
from __future__ import annotations

import asyncio
import inspect
import math
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


async def wait_until(condition: asyncio.Condition, check: Callable[[], T | Awaitable[T]], timeout: float,
                     recheck_s: float = math.inf) -> T:
    """`check()`'s first truthy value, or its last value once `timeout` seconds have passed.

    `check()` is called again after every `notify_all` of `condition`, and at least every `recheck_s`
    seconds (for changes no notify announces, e.g. made by another process). It runs without the
    condition's lock, so it may await (e.g. Redis). No notify is lost while a synchronous check runs: a
    notifier needs the lock, which the waiter asks for before the notifier can run. One made while an
    awaiting check is suspended is seen at the next recheck.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if inspect.isawaitable(value):
            value = await value
        remaining = deadline - time.monotonic()
        if value or remaining <= 0:
            return value
        async with condition:
            try:
                async with asyncio.timeout(min(remaining, recheck_s)):
                    await condition.wait()
            except TimeoutError:
                pass
