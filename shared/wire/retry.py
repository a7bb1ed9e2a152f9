"""Retries as an httpx transport wrapper: the one place that decides what is re-sent, and how soon.

A request is retried through a passing fault (a transport error such as a refused or dropped connection,
or a 5xx answer: a restarting server) only when sending it twice is harmless: a read (GET, HEAD), or a
write the server deduplicates, which its caller marks with `extensions=DEDUPLICATED`. Any other write is
sent once, and its fault reaches the caller. 4xx answers are final, but for 429 (rate limited: the server
did not act on it), which is re-sent after the Retry-After it names. Waits follow `Backoff`.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from functools import partial
from typing import Any, TypeVar

import httpx

from fl_services.shared.wire.backoff import Backoff

log = logging.getLogger(__name__)
T = TypeVar("T")

DEDUPLICATED = {"deduplicated": True}
"""Request extensions of a write the server deduplicates (a repeat is answered, and changes nothing)."""

_READS = frozenset({"GET", "HEAD"})

# 0.2 s doubling to 5 s: a restarting peer is back within seconds, and a long outage costs one request
# every 5 s per waiter.
default_backoff = partial(Backoff, 0.2, 5.0)


class _Retrying:
    """The retry loop, written once for both transports; they differ only in how they send and wait."""

    def __init__(self, attempts: int | None, backoff: Callable[[], Backoff]):
        self.attempts, self.backoff = attempts, backoff

    async def _send(self, request: httpx.Request, attempt: Callable[[httpx.Request], Awaitable[httpx.Response]],
                    pause: Callable[[float], Awaitable[Any]]) -> httpx.Response:
        """`attempt` sends once (a 5xx answer read whole, so it can be logged), `pause` waits."""
        safe = request.method in _READS or bool(request.extensions.get("deduplicated"))
        backoff = self.backoff()
        while True:
            limited = False
            try:
                response = await attempt(request)
            except httpx.TransportError as exc:
                if not safe or self._exhausted(backoff):
                    raise
                fault = repr(exc)
            else:
                # 429: the server refused to act on it (rate limit), so any request may be sent again.
                limited = response.status_code == TOO_MANY_REQUESTS
                if (response.status_code < 500 or not safe) and not limited or self._exhausted(backoff):
                    return response
                fault = f"HTTP {response.status_code}: {response.text[:200]}"
            delay = max(backoff.next(), _retry_after(response) if limited else 0.0)
            log.warning("%s %s failed (%s); retrying in %.1fs", request.method, request.url, fault, delay)
            await pause(delay)

    def _exhausted(self, backoff: Backoff) -> bool:
        return self.attempts is not None and backoff.failures + 1 >= self.attempts


TOO_MANY_REQUESTS = 429


def _retry_after(response: httpx.Response) -> float:
    """The seconds a 429's Retry-After asks for (a number; 0 if absent or a date), at most a minute."""
    try:
        return min(max(float(response.headers.get("Retry-After", 0)), 0.0), 60.0)
    except ValueError:
        return 0.0


def _read_whole(response: httpx.Response) -> bool:
    """Whether an attempt's answer is read at once: one that will be retried (a 5xx, a 429), so that it can
    be logged and its connection freed for the next attempt."""
    return response.status_code >= 500 or response.status_code == TOO_MANY_REQUESTS


class RetryTransport(_Retrying, httpx.AsyncBaseTransport):
    """Wraps `inner`: retries safe requests `attempts` times in all (None: until they get through)."""

    def __init__(self, inner: httpx.AsyncBaseTransport, attempts: int | None = None,
                 backoff: Callable[[], Backoff] = default_backoff):
        super().__init__(attempts, backoff)
        self.inner = inner

    async def _attempt(self, request: httpx.Request) -> httpx.Response:
        response = await self.inner.handle_async_request(request)
        if _read_whole(response):
            await response.aread()  # which also closes it
        return response

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        return await self._send(request, self._attempt, asyncio.sleep)

    async def aclose(self) -> None:
        await self.inner.aclose()


class SyncRetryTransport(_Retrying, httpx.BaseTransport):
    """`RetryTransport` for a synchronous `httpx.Client`."""

    def __init__(self, inner: httpx.BaseTransport, attempts: int | None = None,
                 backoff: Callable[[], Backoff] = default_backoff):
        super().__init__(attempts, backoff)
        self.inner = inner

    def _attempt(self, request: httpx.Request) -> httpx.Response:
        response = self.inner.handle_request(request)
        if _read_whole(response):
            response.read()  # which also closes it
        return response

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        return _run_at_once(self._send(request, _at_once(self._attempt), _at_once(time.sleep)))

    def close(self) -> None:
        self.inner.close()


def _at_once(function: Callable[..., T]) -> Callable[..., Awaitable[T]]:
    """`function` as a coroutine function that completes without ever suspending."""
    async def call(*args: Any) -> T:
        return function(*args)
    return call


def _run_at_once(coroutine: Coroutine[Any, Any, T]) -> T:
    """Runs, without an event loop, a coroutine that awaits only what completes at once (see `_at_once`):
    so the synchronous transport shares the asynchronous one's loop instead of a copy of it."""
    try:
        coroutine.send(None)
    except StopIteration as done:
        return done.value
    coroutine.close()
    raise RuntimeError("a synchronous retry suspended")
