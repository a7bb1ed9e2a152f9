"""The cloud loop, written once: buffer holds B contributions → cloud_update → publish a new version.

It runs as one background task in the cloud process. Everything it reads and writes is in Redis, so a
restarted cloud resumes from the buffer exactly where the killed one stopped.
"""
from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from cloud.metrics import CloudMetrics
from cloud.offers import Offers
from cloud.store import BufferedContribution, StateTooLarge, Store, now
from shared.algorithms import registry
from shared.algorithms.base import Algorithm, Contribution
from shared.cloud_round import CloudRoundOutcome, Diverged, round_record, run_cloud_round
from shared.config import RunConfig
from shared.federation import contribution
from shared.log import bind
from shared.longpoll import wait_until
from shared.schemas import GlobalStateHeader, RunStatus
from shared.transport.records import decode, decode_state, encode

log = logging.getLogger(__name__)
_CACHED_ALGORITHMS = 4
T = TypeVar("T")


class Orchestrator:
    def __init__(self, store: Store, metrics: CloudMetrics | None = None):
        self.store = store
        self.metrics = metrics or CloudMetrics()
        self._wake = asyncio.Event()
        self._changed = asyncio.Condition()
        self._algorithms: dict[str, Algorithm] = {}
        self._stopping = False
        # What long-polling edges are offered: read once for all of them, again after every announce.
        self.offers = Offers(store)

    # ---- signalling ----------------------------------------------------------------------------
    def notify(self) -> None:
        """A contribution arrived or a run changed state: look at the buffer again."""
        self._wake.set()

    async def announce(self) -> None:
        """Wakes long-polling edges after a new version or a status change."""
        self.offers.invalidate()
        async with self._changed:
            self._changed.notify_all()

    async def wait_until(self, check: Callable[[], Awaitable[T]], timeout: float, recheck_s: float = math.inf) -> T:
        """`check()`'s first truthy value, looked for again after every announce (see shared/longpoll.py)."""
        return await wait_until(self._changed, check, timeout, recheck_s)

    def stop(self) -> None:
        """Ends run_forever at its next turn. A flag, because on Python 3.11 a cancel that lands while
        redis-py's own wait_for completes can be lost, and shutdown would wait forever."""
        self._stopping = True
        self._wake.set()

    # ---- the loop ------------------------------------------------------------------------------
    async def run_forever(self, idle_poll_s: float = 1.0) -> None:
        while not self._stopping:
            try:
                async with asyncio.timeout(idle_poll_s):
                    await self._wake.wait()
            except TimeoutError:
                pass
            self._wake.clear()
            try:
                while not self._stopping and await self.step():
                    pass
            except asyncio.CancelledError:
                raise
            except Exception:  # a bad step must not kill the loop; the buffer keeps its entries
                log.exception("cloud update failed; will retry")
                await asyncio.sleep(idle_poll_s)

    def algorithm(self, run_id: str, config: RunConfig) -> Algorithm:
        """The run's algorithm object, cached for the few most recently used runs (one is active at a
        time; downloads of old runs' models must not grow the cache for good)."""
        algorithm = self._algorithms.pop(run_id, None) or registry.create(config)
        self._algorithms[run_id] = algorithm  # most recent last
        while len(self._algorithms) > _CACHED_ALGORITHMS:
            del self._algorithms[next(iter(self._algorithms))]
        return algorithm

    async def step(self) -> bool:
        """One cloud update if the active run's buffer holds B entries; True if it published one."""
        run_id = await self.store.active_run()
        if run_id is None:
            return False
        info = await self.store.info(run_id)
        if info.status not in (RunStatus.running, RunStatus.paused):
            return False
        config = info.config
        entries = await self.store.buffered(run_id, config.topology.buffer_size)
        if len(entries) < config.topology.buffer_size:
            return False
        algorithm = self.algorithm(run_id, config)
        global_blob = await self.store.global_blob(run_id)
        state_blob = await self.store.cloud_state_blob(run_id)
        bind(run_id=run_id)
        update_started = time.perf_counter()
        try:
            contributions, outcome = await asyncio.to_thread(
                self._update, algorithm, global_blob, state_blob, entries, info.version
            )
        except Diverged as e:  # recomputing gives the same: stop the run, and say why
            log.error("run %s %s; stopping it", run_id, e)
            return await self._stop(run_id)
        finally:
            self.metrics.update_seconds.observe(time.perf_counter() - update_started)
        started = info.last_round.finished_at if info.last_round else (info.started_at or now())
        record = round_record(info.version, contributions, outcome, started, info.started_at or started, now())
        header = GlobalStateHeader(run_id=run_id, version=info.version + 1, config=config)
        finished = info.version + 1 >= config.rounds
        try:
            committed = await self.store.commit_update(
                run_id, info.version, entries, encode(outcome.global_, header), encode(outcome.cloud_state), record,
                finished,
            )
        except StateTooLarge:
            # Recomputing would give the same result again: stop the run, loudly, so that it does not loop.
            log.exception("run %s cannot store version %d; stopping it", run_id, info.version + 1)
            return await self._stop(run_id)
        if committed:
            log.info("run %s version %d: acc %.4f", run_id, info.version + 1, record.test_accuracy)
            await self.announce()
        return committed

    async def _stop(self, run_id: str) -> bool:
        """Stops a run whose update cannot be published: recomputing would only give the same again."""
        await self.store.transition(run_id, "stop")
        await self.announce()
        return False

    @staticmethod
    def _update(algorithm: Algorithm, global_blob: bytes, state_blob: bytes | None,
                entries: list[BufferedContribution], version: int) -> tuple[list[Contribution], CloudRoundOutcome]:
        global_, _ = decode(global_blob, GlobalStateHeader)
        cloud_state = decode_state(state_blob) if state_blob else {}
        contributions = [contribution(e.header, decode_state(e.blob)) for e in entries]
        return contributions, run_cloud_round(algorithm, global_, contributions, cloud_state, version)
