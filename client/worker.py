"""One process, many logical clients: their tasks arrive through one long-poll; training runs one at a time.

Local training goes through a single worker thread, so a process never uses more cores than its
torch thread setting, however many logical clients it hosts; when its clients take part in several runs,
the runs' tasks take turns on it (`RoundRobin`). Each task is handled on its own and fails on its own
(see `Worker`); only a refused token ends a logical client.
"""
from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import replace
from functools import partial
from typing import Any, TypeVar

import httpx

from fl_services.client.config import ClientSettings
from fl_services.client.dvfs import Pacer, backend_for, emulated_hold, record_bytes
from fl_services.client.feed import ClientStopped, TaskFeed, Unregistered, check
from fl_services.client.models import ModelPool
from fl_services.client.secagg import SecureUpload
from fl_services.client.state import ClientStateStore
from fl_services.shared.core.algorithms import registry
from fl_services.shared.core.config import RunConfig
from fl_services.shared.core.data import (
    ClientData,
    DataSource,
    DataSourceError,
    PartitionSource,
    check_fits,
    open_source,
)
from fl_services.shared.core.device import local_update
from fl_services.shared.core.federation import evaluate_held_out, local_job, run_task
from fl_services.shared.core.records import Record, decode, encode
from fl_services.shared.core.reports import ReportedFailure
from fl_services.shared.core.tensors import PayloadError, message_of
from fl_services.shared.core.user_code import UserCodeError
from fl_services.shared.runtime.log import bind
from fl_services.shared.wire import bundle
from fl_services.shared.wire.bundle import BundleItem
from fl_services.shared.wire.client_edge import (
    ClientFailureReport,
    ClientResultHeader,
    ClientTaskHeader,
    ResultBatchReceipt,
    ResultOutcome,
)
from fl_services.shared.wire.http import binary_body
from fl_services.shared.wire.protocol import RESULT_BUNDLE
from fl_services.shared.wire.retry import DEDUPLICATED

log = logging.getLogger(__name__)
T = TypeVar("T")


def compute(settings: ClientSettings, header: ClientTaskHeader, task: Record,
            models: ModelPool | None = None) -> bytes:
    """Runs the algorithm's local update for one task and returns the result message, state saved; its model comes
    from `models` where given (the calling training thread's pool, client/models.py)."""
    store = ClientStateStore(settings.state_dir, header.run_id, header.client_id)
    saved = store.saved_result(header.task_id)
    if saved is not None:  # we crashed after training but before the upload was acknowledged
        return saved
    config = _local_config(settings, header.config)
    algorithm = registry.create(config)
    data = client_data(settings, config, header.client_id)
    job = local_job(config, header.client_id, header.round, data)
    if models is not None:
        job = replace(job, model_factory=models.for_task(job.model_factory))
    started = time.perf_counter()
    pacer = Pacer(config, header.client_id, len(data.train), header.budget_s, record_bytes(task),
                  backend_for(settings.dvfs_backend, settings.cpufreq_root))
    # Before training: the device evaluates the global model it received, the task's version (federated evaluation).
    evaluation = evaluate_held_out(algorithm, job, task, settings.compute_device)
    with pacer.installed():  # DVFS before each local epoch (client/dvfs.py)
        update = local_update(algorithm, job, task, store.load(), settings.compute_device)
    result = ClientResultHeader(task_id=header.task_id, client_id=header.client_id,
                                num_samples=update.num_samples, loss=update.loss, metrics=update.metrics,
                                evaluation=evaluation,
                                train_seconds=time.perf_counter() - started,
                                device=pacer.finish(record_bytes(update.tensors)))
    blob = encode(update.tensors, result)
    # Saved where there is state to keep (or an older state to supersede): a crash must then not train
    # again on state already advanced by this task. Without client state (FedAvg, FedProx, FedSGD) a task
    # trained again after a crash gives the same tensors, and the edge counts one result per task id; the
    # fsync this skips was 11 of the 25 ms a CNN task of 5 samples cost on a 2-core development host.
    if update.state or store.exists():
        store.save(header.task_id, update.state, blob)
    return blob


def _local_config(settings: ClientSettings, config: RunConfig) -> RunConfig:
    if settings.data_path and config.data.dataset == "npz":
        data = config.data.model_copy(update={"path": settings.data_path})
        return config.model_copy(update={"data": data})
    return config


class DataMisfit(ValueError):
    """The device's own data cannot train the run's model (reported as the task's failure, with the reasons)."""


@functools.lru_cache(maxsize=1)
def own_source(spec: str) -> DataSource:
    """The device's data source, opened once per process: its data is read once, on first use."""
    return open_source(spec)


def client_data(settings: ClientSettings, config: RunConfig, client_id: int) -> ClientData:
    """What a task trains on: the device's own data (settings.data), or by default the client's partition of the
    run's data set (built once per process, however many clients it hosts)."""
    if settings.data is None:
        return PartitionSource.of_run(config.data, config.seed, client_id).client_data()
    source = own_source(settings.data)
    misfit = check_fits(source.summary(), run_task(config))
    if misfit:
        raise DataMisfit(f"this device's data ({settings.data}) does not fit run {config.name!r}: "
                         f"{'; '.join(misfit)}")
    train, held_out = source.load()
    return ClientData(train=train, test=held_out)


class ResultRefused(Exception):
    """The edge refused a result for good (a 4xx other than a token's or a stale task's)."""


class ResultDeferred(Exception):
    """The edge did not take a result now (its client over the rate of results): the task comes again later."""


def failure_kind(exc: BaseException) -> ReportedFailure:
    """The kind of a task's failure, for the history and the metrics (shared/core/reports.py, FailureKind)."""
    if isinstance(exc, PayloadError):
        return "malformed_task"
    if isinstance(exc, ResultRefused):
        return "refused_result"
    if isinstance(exc, DataMisfit):
        return "misfit"
    if isinstance(exc, DataSourceError):
        return "data"
    if isinstance(exc, (UserCodeError, ImportError)):
        return "user_code"
    return "training"


def _detail(response: httpx.Response) -> str:
    try:
        return str(response.json().get("detail"))
    except (ValueError, AttributeError):
        return response.text[:300]


class RoundRobin:
    """Runs one job at a time on `executor`, taking the queued jobs' keys (runs) in turn: a run with many
    tasks queued in this process does not make another run's tasks wait behind all of them."""

    def __init__(self, executor: Executor):
        self.executor = executor
        self._queues: dict[str, deque[tuple[Callable[[], Any], asyncio.Future[Any]]]] = {}  # the next key first
        self._busy = False

    def busy(self) -> bool:
        """Whether a job runs or waits: more results are on their way."""
        return self._busy or bool(self._queues)

    async def run(self, key: str, job: Callable[[], T]) -> T:
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._queues.setdefault(key, deque()).append((job, future))
        self._next()
        return await future

    def _next(self) -> None:
        while not self._busy and self._queues:
            key = next(iter(self._queues))
            queue = self._queues.pop(key)
            job, future = queue.popleft()
            if queue:
                self._queues[key] = queue  # behind the other keys: they go first
            if future.cancelled():  # its client stopped waiting (a stop): skip it
                continue
            self._busy = True
            running: asyncio.Future[Any] = asyncio.get_running_loop().run_in_executor(self.executor, job)
            running.add_done_callback(partial(self._done, future))

    def _done(self, future: asyncio.Future[Any], running: asyncio.Future[Any]) -> None:
        self._busy = False
        if not future.cancelled():
            error = running.exception()
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(running.result())
        self._next()


class Worker:
    """Serves the process's logical clients: their tasks arrive through one feed (client/feed.py), each is
    trained on the one training thread (the runs taking turns) and answered on its own, so one task's
    failure never touches another's.

    A task that cannot be read or trained (a malformed message, a diverged update) is reported to the edge
    as failed and not retried: the same inputs would fail again. An upload the edge refuses for good (422)
    is dropped likewise. Only a refused token (401/403) ends a client; `run` raises ClientsStopped once
    every client of the process has ended. Cancellation (SIGTERM, Ctrl-C) propagates at once.
    """

    def __init__(self, settings: ClientSettings, client_ids: list[int], edge: httpx.AsyncClient):
        self.settings = settings
        self.client_ids = client_ids
        self.edge = edge
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="train")
        # One training at a time for the whole process, the runs taking turns.
        self.trainer = RoundRobin(self.executor)
        self.models = ModelPool()  # used by the one training thread only
        # A device on its own data describes it when it registers (a run over registered devices checks it fits).
        summary = own_source(settings.data).summary() if settings.data is not None else None
        self.feed = TaskFeed(settings, edge, client_ids, self._deliver, summary)
        self.completed = 0
        # Tasks whose training raised (e.g. diverged to NaN) or whose result was refused: the same inputs
        # would fail again, so they are not retried (the feed keeps holding them); the edge treats the
        # client as dropped for that round.
        self.failed: set[str] = set()
        self._handling: set[asyncio.Task[None]] = set()
        # Results waiting to go up together in a result bundle (`submit`), each with its outcome's future; the
        # clients that speak with the edges' secret (not their own token) and several of them: a bundle is the
        # secret's to send.
        self._queued: list[tuple[int, str, bytes, asyncio.Future[ResultOutcome | None]]] = []
        self._more = asyncio.Event()
        self._sender: asyncio.Task[None] | None = None
        self.bundles = len(client_ids) > 1 and any(k not in settings.client_tokens for k in client_ids)

    @property
    def stopped(self) -> dict[int, str]:
        """Logical clients ended for good, with the reason."""
        return self.feed.stopped

    async def run(self) -> None:
        """Serves until cancelled; raises ClientsStopped when every logical client has stopped for good."""
        try:
            await self.feed.run()
        finally:
            for task in self._handling:
                task.cancel()
            if self._sender is not None:
                self._sender.cancel()

    def _deliver(self, item: BundleItem) -> None:
        task = asyncio.create_task(self._handle(item))
        self._handling.add(task)
        task.add_done_callback(self._handling.discard)

    async def _handle(self, item: BundleItem) -> None:
        """One task: trained, its result uploaded; the feed holds it until then (or for good if it failed)."""
        client_id = item.client_id
        bind(client_id=client_id)
        release = True
        try:
            try:
                header = message_of(item.head, ClientTaskHeader)  # the head alone holds the header
                if (header.client_id, header.task_id) != (client_id, item.task_id):
                    raise PayloadError(f"the bundle names task {item.task_id!r} of client {client_id}, its "
                                       f"message task {header.task_id!r} of client {header.client_id}")
            except PayloadError as exc:  # a malformed task: reported as failed, not fetched again
                log.error("client %d: task %s is malformed: %s", client_id, item.task_id, exc)
                release = False
                self.failed.add(item.task_id)
                await self.report_failure(client_id, item.task_id, exc)
                return
            bind(run_id=header.run_id)
            received = time.monotonic()
            try:
                result = await self.trainer.run(header.run_id,
                                                partial(_train, self.settings, header, item, self.models))
            except Exception as exc:
                kind = failure_kind(exc)
                # Data that does not fit or cannot be read is said in full by its message, again at every round's
                # task: no traceback. Anything else (the run's own code among it) gets one, to find where.
                log.error("client %d: task %s failed (%s); skipping it: %s", client_id, header.task_id, kind, exc,
                          exc_info=kind not in ("misfit", "data"))
                release = False
                self.failed.add(header.task_id)
                await self.report_failure(client_id, header.task_id, exc)
                return
            # An emulated device takes its modelled time (DVFS): waited here, not on the shared training thread,
            # and not past its run's end (a time_scale of 1,000 held a stopped run's result for ~1,000 s).
            hold = emulated_hold(header.config, result, time.monotonic() - received)
            if hold > 0:
                ended = self.feed.run_end(header.run_id)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(ended.wait(), hold)
                if ended.is_set():
                    log.info("client %d: run %s ended during the emulated hold; its result is dropped",
                             client_id, header.run_id)
                    return
            if header.secure_round is not None:  # the update leaves the device only masked
                update, result_header = await asyncio.to_thread(decode, result, ClientResultHeader)
                await SecureUpload(self.edge, self.feed.auth[client_id], header, self.settings.long_poll_s).run(
                    update, result_header)
                self.completed += 1
            else:
                release = await self.submit(client_id, header, result)
            log.debug("client %d: task %s done", client_id, header.task_id)
        except ClientStopped as exc:
            self.feed.stop(client_id, str(exc))
        except Unregistered:
            # Registered again, the task comes back and its stored result is sent without retraining.
            self.feed.unregistered(client_id)
        except Exception as exc:  # never CancelledError (a BaseException): a stop still ends every task
            # E.g. the edge away for longer than the retries last: the task is fetched again after a wait
            # (its stored result re-sent), while the other clients' tasks go on.
            delay = self.settings.retry_initial_s
            log.error("client %d: task %s: %s: %s; fetching it again in %.3gs", client_id, item.task_id,
                      type(exc).__name__, exc, delay)
            await asyncio.sleep(delay)
        finally:
            if release:
                self.feed.release(item.task_id)

    async def report_failure(self, client_id: int, task_id: str, exc: Exception) -> None:
        """Tells the edge why the task cannot be trained here (e.g. the run's model package is missing from
        this environment): the round stops waiting for this client and its record shows the reason."""
        report = ClientFailureReport(task_id=task_id, client_id=client_id, error=f"{type(exc).__name__}: {exc}"[:1000],
                                     kind=failure_kind(exc))
        # Re-sent through a passing fault: a repeated report of the same task's failure records it again.
        response = await self.edge.post(f"/api/v1/clients/{client_id}/failures", json=report.model_dump(),
                                        headers=self.feed.auth[client_id], extensions=DEDUPLICATED)
        if response.status_code >= 400:  # e.g. 409: the round moved on meanwhile; the log above says why
            log.warning("client %d: edge did not take the failure report of task %s: %s %s", client_id,
                        task_id, response.status_code, response.text[:300])

    async def submit(self, client_id: int, header: ClientTaskHeader, blob: bytes) -> bool:
        """Sends the result, with others of this process's clients where it can (a result bundle), else on its own
        (`upload`); False if the edge refused it for good (the task is not to be fetched again)."""
        if not self.bundles or client_id in self.settings.client_tokens:
            return await self.upload(client_id, header, blob)
        outcome: asyncio.Future[ResultOutcome | None] = asyncio.get_running_loop().create_future()
        self._queued.append((client_id, header.task_id, blob, outcome))
        self._more.set()
        if self._sender is None or self._sender.done():
            self._sender = asyncio.create_task(self._send_queued())
        answer = await outcome
        if answer is None:  # sent on its own: alone in its bundle, too large for one, or an edge without bundles
            return await self.upload(client_id, header, blob)
        if answer.status in (401, 403):
            raise ClientStopped(f"the edge refuses this client's token (HTTP {answer.status}: {answer.detail})")
        if answer.status == 404:
            raise Unregistered()
        if answer.status == 429:
            raise ResultDeferred(answer.detail)
        return await self._settle(client_id, header, answer.status, answer.detail)

    async def _send_queued(self) -> None:
        """Sends the queued results, in bundles of up to BUNDLE_ITEMS results and BUNDLE_BYTES bytes, until none is
        left. While the training thread has more tasks of the process, a bundle waits up to BUNDLE_WAIT_S for
        their results: one request then carries many, where sending each at once made bundles of one or two."""
        while self._queued:
            waited_since = time.monotonic()
            while len(self._queued) < BUNDLE_ITEMS and self.trainer.busy():
                left = BUNDLE_WAIT_S - (time.monotonic() - waited_since)
                if left <= 0:
                    break
                self._more.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._more.wait(), left)
            size, count = 0, 0
            for _, _, blob, _ in self._queued[:BUNDLE_ITEMS]:
                if count and size + len(blob) > BUNDLE_BYTES:
                    break
                size, count = size + len(blob), count + 1
            batch, self._queued = self._queued[:count], self._queued[count:]
            try:
                outcomes = await self._send_bundle(batch) if len(batch) > 1 else [None]
            except Exception as exc:  # never CancelledError: a stop ends the waiting tasks themselves
                for *_, future in batch:
                    if not future.done():
                        future.set_exception(exc)
                continue
            for (*_, future), outcome in zip(batch, outcomes, strict=True):
                if not future.done():
                    future.set_result(outcome)

    async def _send_bundle(self, batch: list[tuple[int, str, bytes, asyncio.Future[ResultOutcome | None]]]
                           ) -> list[ResultOutcome | None]:
        """Each result's outcome, or None for each where it is to be sent on its own (the edge predates result
        bundles or refuses this process's token for them, or the bundle was too large for it)."""
        body = bundle.pack([(client_id, task_id, blob, b"") for client_id, task_id, blob, _ in batch])
        # Re-sent through a passing fault: each result is accepted once, and a repeat's outcome is a 409.
        response = await self.edge.post("/api/v1/clients/results", content=body,
                                        headers={"Content-Type": RESULT_BUNDLE, **self.feed.auth[batch[0][0]]},
                                        extensions=DEDUPLICATED)
        if response.status_code in (401, 403, 404, 405):
            # An edge without the route, or a token that is not the edges' secret (a device token hosting several
            # clients): every result on its own from now on, where each gets its own answer.
            log.info("the edge takes no result bundles from this process (HTTP %d: %s): sending each result on "
                     "its own", response.status_code, _detail(response))
            self.bundles = False
            return [None] * len(batch)
        if response.status_code == 413:  # larger than the edge takes: these on their own
            return [None] * len(batch)
        response.raise_for_status()  # e.g. a 5xx past the retries: the tasks are fetched again after a wait
        outcomes = ResultBatchReceipt.model_validate_json(response.content).results
        if [(o.client_id, o.task_id) for o in outcomes] != [(k, t) for k, t, _, _ in batch]:
            raise ValueError("the edge's answer to a result bundle does not name its results in order")
        return list(outcomes)

    async def upload(self, client_id: int, header: ClientTaskHeader, blob: bytes) -> bool:
        """Sends the result on its own; False if the edge refused it for good (the task is not to be fetched
        again)."""
        # Re-sent through a passing fault: the edge accepts one result per task id and answers a repeat 409.
        response = await self.edge.post(f"/api/v1/clients/{client_id}/results",
                                        **binary_body(blob, self.feed.auth[client_id]), extensions=DEDUPLICATED)
        if response.status_code in (401, 403, 404):
            check(response)
        return await self._settle(client_id, header, response.status_code,
                                  _detail(response) if response.status_code >= 400 else None)

    async def _settle(self, client_id: int, header: ClientTaskHeader, status: int, detail: str | None) -> bool:
        """What the edge's answer to a result means here; False if it refused the result for good."""
        if status == 409:
            # Already accepted (a retried upload) or the round moved on: nothing left to do either way.
            log.info("client %d: task %s: %s", client_id, header.task_id, detail)
        elif status >= 400:
            # E.g. a diverged update beyond the edge's bounds (422): the same result would be refused again,
            # so it is not re-sent. Reported as the task's failure: the round stops waiting for this client
            # instead of waiting until its deadline.
            log.error("client %d: edge refused task %s: %s %s", client_id, header.task_id, status, detail)
            self.failed.add(header.task_id)
            await self.report_failure(client_id, header.task_id, ResultRefused(
                f"the edge refused the result: {status} {detail}"))
            return False
        else:
            self.completed += 1
        return True


# A result bundle's bounds: a CNN's results are ~180 KB each (128 of them 23 MB, under an edge's default 64 MiB
# max_payload_bytes); a result larger than BUNDLE_BYTES goes alone. BUNDLE_WAIT_S is the most a result waits for
# others while the training thread has more of the process's tasks.
BUNDLE_ITEMS = 128
BUNDLE_BYTES = 16 * 2**20
BUNDLE_WAIT_S = 0.25


def _train(settings: ClientSettings, header: ClientTaskHeader, item: BundleItem, models: ModelPool) -> bytes:
    """The training thread's job: the task's tensors read there, not on the event loop."""
    task, _ = decode(item.message(), ClientTaskHeader)
    return compute(settings, header, task, models)
