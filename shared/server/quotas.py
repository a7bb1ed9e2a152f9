"""Per-caller quotas: requests per moving window (429 with Retry-After) and requests open at once."""
from __future__ import annotations

import collections
import math
import time
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager

import limits
from fastapi import HTTPException, Request, status
from limits.aio.storage import MemoryStorage
from limits.aio.strategies import MovingWindowRateLimiter


class RateLimit:
    """Requests per caller and route group, in a moving window (the `limits` package, kept in memory: each
    service process counts its own callers). Past the rate: 429 with Retry-After."""

    def __init__(self, rate: str):
        self.rate = limits.parse(rate)
        self._window = MovingWindowRateLimiter(MemoryStorage())

    async def check(self, group: str, caller: int | str) -> None:
        if not await self._window.hit(self.rate, group, str(caller)):
            reset_at = (await self._window.get_window_stats(self.rate, group, str(caller))).reset_time
            retry_s = max(1, math.ceil(reset_at - time.time()))
            raise HTTPException(status.HTTP_429_TOO_MANY_REQUESTS,
                                f"more than {self.rate} {group} requests for {caller}; retry in {retry_s} s",
                                headers={"Retry-After": str(retry_s)})


async def rate_limited(request: Request, group: str, caller: int | str) -> None:
    """429 if `caller` (the client or edge the request acts for) exceeds the service's rate in `group`."""
    await request.app.state.rate_limit.check(group, caller)


class OpenRequests:
    """Requests per caller and route group open at once (long-polls, uploads): past `limit`, 429 with
    Retry-After. Every caller shares the server's connections (max_connections): one device's token holding
    49 task long-polls on a 50-connection edge answered every other client, and /health, 503."""

    def __init__(self, limit: int):
        self.limit = limit
        self._open: collections.Counter[tuple[str, str]] = collections.Counter()

    @asynccontextmanager
    async def hold(self, group: str, caller: int | str) -> AsyncIterator[None]:
        key = (group, str(caller))
        if self._open[key] >= self.limit:
            raise HTTPException(status.HTTP_429_TOO_MANY_REQUESTS,
                                f"{self.limit} {group} requests for {caller} are open already; retry in 1 s",
                                headers={"Retry-After": "1"})
        self._open[key] += 1
        try:
            yield
        finally:
            self._open[key] -= 1
            if not self._open[key]:
                del self._open[key]


def open_request(request: Request, group: str, caller: int | str) -> AbstractAsyncContextManager[None]:
    """Holds one of `caller`'s open requests in `group` while the route serves (429 past the service's
    max_open_per_caller)."""
    return request.app.state.open_requests.hold(group, caller)
