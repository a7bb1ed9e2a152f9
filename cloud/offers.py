"""What a long-polling edge is offered, read from Redis once for all of them.

A thousand edges long-poll at once, and each looks again at every announce and every half second: read
per poll, that was thousands of Redis commands a second, and more at once than the connection pool holds.
Here one read of the active run (its status and version) serves every poll for up to `max_age_s`, or
until the orchestrator announces a change (`invalidate`); one read of each new version's global state
serves every edge it is offered to. Only the edge that is due a new version reads anything of its own
(whether its last contribution still waits in the buffer).
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass
from typing import Any, TypeVar

from cloud.store import Store
from shared.schemas import RunStatus

T = TypeVar("T")


@dataclass(frozen=True)
class ActiveRun:
    run_id: str
    status: RunStatus
    version: int
    num_edges: int


class _Shared:
    """Concurrent callers asking for the same key share one call (and its outcome)."""

    def __init__(self) -> None:
        self._running: dict[Hashable, asyncio.Future[Any]] = {}

    async def __call__(self, key: Hashable, call: Callable[[], Awaitable[T]]) -> T:
        future = self._running.get(key)
        if future is None:
            future = self._running[key] = asyncio.ensure_future(call())
            future.add_done_callback(lambda done: self._forget(key, done))
        # Shielded: a poll that ends (its client left) must not cancel the call the others wait for.
        return await asyncio.shield(future)

    def _forget(self, key: Hashable, done: asyncio.Future[Any]) -> None:
        del self._running[key]
        if not done.cancelled():
            done.exception()  # retrieved: a failure nobody awaited any more is not logged as lost


class Offers:
    def __init__(self, store: Store, max_age_s: float = 0.5):
        self.store, self.max_age_s = store, max_age_s
        self._generation = 0  # moves on at every announced change: what was read before it is stale
        self._seen: tuple[int, float, ActiveRun | None] | None = None  # (generation, read at, what)
        self._num_edges: dict[str, int] = {}  # of the active run only: a run's config never changes
        self._global: tuple[str, int, bytes] | None = None  # the newest global state read: run, version, blob
        self._shared = _Shared()

    def invalidate(self) -> None:
        """A run changed state or published a version: the next look reads Redis again."""
        self._generation += 1

    async def active(self) -> ActiveRun | None:
        """The active run as of at most `max_age_s` ago and after the last `invalidate`, read once for
        every concurrent caller."""
        generation = self._generation
        seen = self._seen
        if seen is not None and seen[0] == generation and time.monotonic() - seen[1] < self.max_age_s:
            return seen[2]
        return await self._shared(("active", generation), lambda: self._read(generation))

    async def _read(self, generation: int) -> ActiveRun | None:
        started = time.monotonic()
        run_id = await self.store.active_run()
        run = None
        if run_id is not None:
            status, version = await self.store.status(run_id)
            if run_id not in self._num_edges:
                self._num_edges = {run_id: (await self.store.config(run_id)).topology.num_edges}
            run = ActiveRun(run_id, status, version, self._num_edges[run_id])
        if self._seen is None or self._seen[0] <= generation:
            self._seen = (generation, started, run)
        return run

    async def offer(self, edge_id: int, run_id: str | None, after: int) -> bytes | None:
        """The active run's global state if it is newer than what the edge has and the edge belongs to it."""
        active = await self.active()
        if active is None or active.status != RunStatus.running or edge_id >= active.num_edges:
            return None
        if active.run_id == run_id and active.version <= after:
            return None
        # An edge re-executes only once its own triple has been consumed (on the newest version then),
        # never while that triple waits in the buffer.
        if await self.store.has_pending(active.run_id, edge_id):
            return None
        cached = self._global
        if cached is None or cached[0] != active.run_id or cached[1] < active.version:
            cached = await self._shared(("global", active.run_id, active.version),
                                        lambda: self._read_global(active.run_id))
        return cached[2]

    async def _read_global(self, run_id: str) -> tuple[str, int, bytes]:
        version, blob = await self.store.versioned_global(run_id)
        read = (run_id, version, blob)
        if self._global is None or self._global[0] != run_id or self._global[1] < version:
            self._global = read
        return read
