"""Ending background tasks whose cancel can be lost."""
from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable
from typing import Any


async def cancel_until_done(tasks: Iterable[asyncio.Task[Any]], retry_s: float = 0.5) -> None:
    """Cancels the tasks and waits until every one has ended, cancelling again every `retry_s` those still
    running: on Python 3.11 a cancel that lands while a library's own wait_for completes (redis-py's) can be
    lost, and the task would then run on. Their CancelledError is not raised here; any other exception is."""
    tasks = list(tasks)
    pending = set(tasks)
    while pending:
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=retry_s)
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError):
            await task
