"""The cloud loop, written once: buffer holds B contributions → cloud_update → publish a new version.

It runs as one background task in each cloud process (replica). Everything it reads and writes is in the
storage (cloud/storage), so a restarted cloud resumes from the buffer exactly where the killed one stopped;
with several replicas, a lease per run lets one of them compute each update (its commit fenced by the lease),
and the storage's events tell every replica's waiters (long-polling edges, dashboards) of a new version or
status at once.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import torch

from fl_services.cloud.global_states import GlobalStates
from fl_services.cloud.metrics import CloudMetrics
from fl_services.cloud.storage import (
    UPDATABLE,
    BufferedContribution,
    Lease,
    LeaseLost,
    NotFound,
    StateTooLarge,
    StorageUnavailable,
    Store,
    now,
)
from fl_services.shared.core import late
from fl_services.shared.core.algorithms import privacy, registry
from fl_services.shared.core.algorithms.base import Algorithm, Contribution
from fl_services.shared.core.cloud_round import (
    CloudRoundOutcome,
    Diverged,
    evaluate_outcome,
    round_record,
    run_cloud_round,
    with_evaluation,
)
from fl_services.shared.core.config import RunConfig
from fl_services.shared.core.device import CPU, computing_on
from fl_services.shared.core.federation import cloud_evaluates, evaluate_global
from fl_services.shared.core.records import decode, decode_state, encode
from fl_services.shared.core.reports import RoundRecord, RunStatus
from fl_services.shared.runtime.log import bind
from fl_services.shared.server.longpoll import Announcer, wait_until
from fl_services.shared.wire.admin import RunInfo
from fl_services.shared.wire.backoff import Backoff
from fl_services.shared.wire.edge_cloud import GlobalStateHeader

log = logging.getLogger(__name__)
_CACHED_ALGORITHMS = 4
T = TypeVar("T")


class Orchestrator:
    # Wait before subscribing again after the event channel's connection failed (the storage away).
    resubscribe_s: float = 0.5
    resubscribe_max_s: float = 10.0

    def __init__(self, store: Store, metrics: CloudMetrics | None = None, replica: str = "cloud",
                 lease_s: float = 10.0, max_update_failures: int = 10, device: torch.device = CPU):
        self.store = store
        self.device = device  # where it evaluates and trains hfpl's classifier (shared/core/device.py)
        self.metrics = metrics or CloudMetrics()
        self.replica = replica
        self.lease_s = lease_s
        self.max_update_failures = max_update_failures
        self._failures: dict[str, int] = {}  # per run, its updates failed in a row
        self._wake = asyncio.Event()
        self._changed = Announcer()
        self._algorithms: dict[str, Algorithm] = {}
        self.globals = GlobalStates(store)  # what edges are served and contributions checked against
        # Per run, the evaluation of its latest version, running off the critical path (see _evaluate_later).
        self._evaluations: dict[str, asyncio.Task[None]] = {}
        self._stopping = False
        self._active = 0  # how many runs were active at the last look
        # Per active run, its version and status at the loop's last look (see _look).
        self._looked: dict[str, tuple[int, RunStatus]] = {}

    # ---- signalling ----------------------------------------------------------------------------
    def notify(self) -> None:
        """A contribution arrived or a run changed state: look at the buffer again."""
        self._wake.set()

    async def announce(self) -> None:
        """Wakes long-polling edges after a new version or a status change: this replica's at once, the
        others' through the event channel."""
        await self.wake_waiters()
        try:
            await self.store.publish(self.replica)
        except StorageUnavailable:  # the other replicas' waiters look again at their deadline
            log.warning("could not announce a change to the other cloud replicas: the storage is unavailable")

    async def wake_waiters(self) -> None:
        """Every wait_until of this process looks again (e.g. the process is stopping)."""
        await self._changed.notify_all()

    async def relay_events(self) -> None:
        """Listens to the event channel (one connection per process) and wakes this replica's waiters and
        loop when another replica announces a change; subscribes again after a failure."""
        backoff = Backoff(self.resubscribe_s, self.resubscribe_max_s)

        async def subscribed() -> None:
            backoff.reset()
            await self._heard("")  # whatever was announced while unsubscribed is looked at now

        while not self._stopping:
            try:
                await self.store.listen(subscribed, self._heard)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                delay = backoff.next()
                log.warning("cloud event channel lost (%s); subscribing again in %.3g s", exc, delay)
                await asyncio.sleep(delay)

    async def _heard(self, sender: str) -> None:
        if sender != self.replica:  # this replica's own announcements woke its waiters already
            self._wake.set()
            await self.wake_waiters()

    async def wait_until(self, check: Callable[[], Awaitable[T]], timeout: float, recheck_s: float = math.inf) -> T:
        """`check()`'s first truthy value, looked for again after every announce (see shared/server/longpoll.py)."""
        return await wait_until(self._changed, check, timeout, recheck_s)

    def stop(self) -> None:
        """Ends run_forever at its next turn. A flag, because on Python 3.11 a cancel that lands while a
        storage client's own wait_for completes (redis-py's) can be lost, and shutdown would wait forever."""
        self._stopping = True
        self._wake.set()

    # ---- the loop ------------------------------------------------------------------------------
    async def run_forever(self, idle_poll_s: float = 1.0) -> None:
        try:
            # The loop's updates and evaluations, threads and tasks, inherit the context's device.
            with computing_on(self.device):
                await self._loop(idle_poll_s)
        finally:  # an evaluation cut short leaves its record to the next update (see _evaluated)
            for task in self._evaluations.values():
                task.cancel()
            await asyncio.gather(*self._evaluations.values(), return_exceptions=True)

    async def _loop(self, idle_poll_s: float) -> None:
        migrated = False
        while not self._stopping:
            try:
                async with asyncio.timeout(idle_poll_s):
                    await self._wake.wait()
            except TimeoutError:
                pass
            self._wake.clear()
            try:
                if not migrated:  # here rather than at start-up: the storage may be away then
                    await self.store.migrate()
                    migrated = True
                while not self._stopping and await self.step():
                    pass
            except asyncio.CancelledError:
                raise
            except Exception:  # a bad step must not kill the loop; the buffer keeps its entries
                log.exception("cloud update failed; will retry")
                await asyncio.sleep(idle_poll_s)

    def algorithm(self, run_id: str, config: RunConfig) -> Algorithm:
        """The run's algorithm object, cached for the most recently used runs (at least the active ones;
        downloads of old runs' models must not grow the cache for good)."""
        algorithm = self._algorithms.pop(run_id, None) or registry.create(config)
        self._algorithms[run_id] = algorithm  # most recent last
        while len(self._algorithms) > max(_CACHED_ALGORITHMS, self._active):
            del self._algorithms[next(iter(self._algorithms))]
        return algorithm

    async def step(self) -> bool:
        """One cloud update of every active run whose buffer holds B entries; True if any was published.
        One run's failure is logged and leaves the others' updates (and its own buffer) as they are."""
        runs = await self.store.active_runs()
        self._active = len(runs)
        gone = self._looked.keys() - set(runs)  # ended, perhaps by a replica that died before announcing it
        for run_id in gone:
            del self._looked[run_id]
        if gone:
            await self.wake_waiters()
        self.globals.retain(runs)
        published = False
        for run_id in runs:
            if self._stopping:
                break
            try:
                published |= await self.update(run_id)
                self._failures.pop(run_id, None)
            except asyncio.CancelledError:
                raise
            except StorageUnavailable:  # every run's update waits for it alike
                raise
            except Exception as exc:  # the buffer keeps its entries: the update is retried at the next turn
                failures = self._failures[run_id] = self._failures.get(run_id, 0) + 1
                if failures < self.max_update_failures:
                    log.exception("cloud update of run %s failed (%d in a row); will retry", run_id, failures)
                    continue
                log.exception("cloud update of run %s failed %d times in a row; stopping it", run_id, failures)
                del self._failures[run_id]
                with contextlib.suppress(NotFound):  # deleted meanwhile
                    await self._stop(run_id, f"its cloud update failed {failures} times in a row, its buffer kept "
                                             f"({type(exc).__name__}: {exc})")
        return published

    async def update(self, run_id: str) -> bool:
        """One cloud update if the run's buffer holds B entries and this replica takes the run's lease (none
        other computes it meanwhile); True if it published one."""
        try:
            info = await self.store.info(run_id)
        except NotFound:  # stopped and deleted since the active runs were listed
            return False
        await self._look(run_id, info)
        # A paused run's contributions wait in the buffer: its version holds until it resumes.
        if info.status not in UPDATABLE or info.buffered < info.config.topology.buffer_size:
            return False
        lease = await self.store.acquire_lease(run_id, self.lease_s, self.replica)
        if lease is None:
            return False  # another replica computes it; if it dies, the lease expires and this one will
        computed = asyncio.Event()
        renewing = asyncio.create_task(self._renew(lease, computed))
        try:
            return await self._publish_update(run_id, lease, computed, renewing)
        finally:
            computed.set()
            renewing.cancel()
            with contextlib.suppress(LeaseLost, StorageUnavailable):  # lost or expired: nothing to give back
                await self.store.release_lease(lease)

    async def _look(self, run_id: str, info: RunInfo) -> None:
        """Wakes this replica's waiters where a run's version or status moved since the loop's last look: a
        replica that committed a version (or a stop) and died before announcing it on the event channel would
        otherwise leave the edges long-polling here waiting until their timeout. This replica's own commits are
        not counted (see _publish_update); any other change, already announced (another replica's version, a
        status changed through an API), wakes them a second time, to no harm."""
        seen = (info.version, info.status)
        if self._looked.setdefault(run_id, seen) != seen:
            self._looked[run_id] = seen
            await self.wake_waiters()

    async def _renew(self, lease: Lease, computed: asyncio.Event) -> None:
        """Keeps the lease until the update is `computed`; once lost, the commit refuses to publish. Ended by the
        event, not by a cancel: a cancel that lands in a storage call can be lost there (redis-py under Python
        3.11's wait_for), and this task would then renew the lease for ever, the commit waiting on it."""
        while not computed.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(computed.wait(), self.lease_s / 3)
                return
            try:
                await self.store.extend_lease(lease)
            except LeaseLost:
                log.warning("run %s: the update lease expired while this replica computed it", lease.run_id)
                return
            except StorageUnavailable:
                pass  # tried again at the next turn, while the lease lasts

    async def _publish_update(self, run_id: str, lease: Lease, computed: asyncio.Event,
                              renewing: asyncio.Task[None]) -> bool:
        """The update under the lease. Everything is read again: another replica may have published it
        between the first look and the lease."""
        info = await self._evaluated(run_id)
        if info.status not in UPDATABLE:
            return False
        config = info.config
        entries = await self.store.buffered(run_id, config.topology.buffer_size)
        if len(entries) < config.topology.buffer_size:
            return False
        algorithm = self.algorithm(run_id, config)
        # The state this process serves, where it is the current version (under the lease none newer is).
        global_blob = await self.globals.blob(run_id, info.version)
        state_blob = await self.store.cloud_state_blob(run_id)
        bind(run_id=run_id)
        update_started = time.perf_counter()
        # The last round, or the last the privacy budget allows (privacy.rounds_to_run): evaluated before it is
        # published, so that a finished run's history is complete; any other, once published.
        finished = info.version + 1 >= privacy.rounds_to_run(config)
        try:
            contributions, outcome = await asyncio.to_thread(
                self._update, algorithm, global_blob, state_blob, entries, info.version, finished
            )
        except Diverged as e:  # recomputing gives the same: stop the run, and say why
            log.error("run %s %s; stopping it", run_id, e)
            return await self._stop(run_id, str(e))
        finally:
            self.metrics.update_seconds.observe(time.perf_counter() - update_started)
        started = info.last_round.finished_at if info.last_round else (info.started_at or now())
        record = round_record(info.version, contributions, outcome, started, info.started_at or started,
                              now(), config.dvfs.modelled).model_copy(update={"computed_by": self.replica})
        header = GlobalStateHeader(run_id=run_id, version=info.version + 1, config=config,
                                   buffer_waits=buffer_waits(entries))
        # No renewal during the commit: the commit is fenced by the lease (Redis WATCHes it), and a renewal (a
        # write to it) would abort it, making this replica compute the same update again. The last renewal
        # left ≥ 2/3 of the lease; the renewal under way, if any, ends first.
        computed.set()
        await asyncio.wait({renewing})
        new_global = encode(outcome.global_, header)
        try:
            committed = await self.store.commit_update(
                run_id, info.version, entries, new_global, encode(outcome.cloud_state), record,
                finished, lease=lease,
            )
        except StateTooLarge as e:
            # Recomputing would give the same result again: stop the run, loudly, so that it does not loop.
            log.exception("run %s cannot store version %d; stopping it", run_id, info.version + 1)
            return await self._stop(run_id, f"version {info.version + 1} cannot be stored: {e}")
        if committed:
            self.globals.keep(run_id, info.version + 1, new_global)
            for failed in record.failed_clients:
                self.metrics.client_failures.labels(failed.kind).inc()
            dropped = sum(c.dropped for c in record.contributions)
            if dropped:
                self.metrics.stale_dropped.inc(dropped)
            if finished:
                log.info("run %s version %d: acc %.4f", run_id, info.version + 1, record.test_accuracy)
            elif cloud_evaluates(config):
                self._evaluations[run_id] = asyncio.create_task(
                    self._evaluate_later(run_id, algorithm, outcome, record))
            if finished and info.version + 1 < config.rounds:
                log.info("run %s finished at version %d of %d: its privacy budget ε = %g is spent (ε = %.4g)",
                         run_id, info.version + 1, config.rounds, config.privacy.epsilon_budget, record.epsilon)
            self._looked.pop(run_id, None)  # this replica's own change, announced: nothing to wake for
            await self.announce()
        return committed

    async def _stop(self, run_id: str, reason: str) -> bool:
        """Stops a run whose update cannot be published: recomputing would only give the same again. The reason
        is the run's (RunInfo.reason), not only this replica's log's."""
        await self.store.transition(run_id, "stop", reason)
        await self.announce()
        return False

    # ---- evaluation, off the critical path ---------------------------------------------------------
    async def _evaluate_later(self, run_id: str, algorithm: Algorithm, outcome: CloudRoundOutcome,
                              record: RoundRecord) -> None:
        """Evaluates a version already published (edges train on it meanwhile) and fills its figures into
        its history record: the same figures as evaluating it before publishing, as the reference does."""
        try:
            evaluated = await asyncio.to_thread(evaluate_outcome, algorithm, outcome)
            filled = with_evaluation(record, evaluated.evaluation)
            if await self.store.fill_evaluation(run_id, filled):
                log.info("run %s version %d: acc %.4f", run_id, record.version, filled.test_accuracy)
        except asyncio.CancelledError:
            raise
        except Exception:  # e.g. the storage away: the next update evaluates it again before it is computed
            log.exception("run %s: evaluating version %d failed; the next update retries it", run_id, record.version)

    async def _evaluated(self, run_id: str) -> RunInfo:
        """Before the next update: the evaluation of the current version is in its record. This replica's
        own is awaited (it had a round's time: only a round shorter than an evaluation waits here); one that
        no process finished (a replica killed, a cloud restarted) is done now, from the current state. The
        run's info as it is then."""
        running = self._evaluations.pop(run_id, None)
        if running is not None:
            with contextlib.suppress(Exception):  # whatever failed is redone below
                await running
        info = await self.store.info(run_id)
        record = info.last_round
        if (record is None or not math.isnan(record.test_accuracy) or record.version != info.version
                or not cloud_evaluates(info.config)):
            return info
        algorithm = self.algorithm(run_id, info.config)
        global_blob = await self.store.global_blob(run_id)
        state_blob = await self.store.cloud_state_blob(run_id)
        global_, _ = await asyncio.to_thread(decode, global_blob, GlobalStateHeader)
        cloud_state = await asyncio.to_thread(decode_state, state_blob) if state_blob else {}
        evaluation = await asyncio.to_thread(evaluate_global, info.config, algorithm, global_, cloud_state)
        await self.store.fill_evaluation(run_id, with_evaluation(record, evaluation))
        return await self.store.info(run_id)

    @staticmethod
    def _update(algorithm: Algorithm, global_blob: bytes, state_blob: bytes | None,
                entries: list[BufferedContribution], version: int,
                evaluate: bool) -> tuple[list[Contribution], CloudRoundOutcome]:
        global_, _ = decode(global_blob, GlobalStateHeader)
        cloud_state = decode_state(state_blob) if state_blob else {}
        contributions = [c for e in entries
                         for c in late.contributions(algorithm.config, e.header, decode_state(e.blob))]
        return contributions, run_cloud_round(algorithm, global_, contributions, cloud_state, version, evaluate)


def buffer_waits(entries: list[BufferedContribution]) -> dict[int, float]:
    """Per edge, how much later the buffer filled than its contribution arrived, were it not there: the
    latest arrival among the others, minus its own (DVFS slack, edge/pacing.py). The last to arrive gets a
    negative figure, how far behind the others it was: it was on the critical path by that much. Only
    relative to other contributions: a buffer of one says nothing."""
    if len(entries) < 2:
        return {}
    return {e.header.edge_id: max(o.received_s for o in entries if o is not e) - e.received_s for e in entries}
