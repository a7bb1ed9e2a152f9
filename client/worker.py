"""One process, many logical clients: each pulls its tasks by long-poll; training runs one at a time.

Local training goes through a single worker thread, so a process never uses more cores than its
torch thread setting, however many logical clients it hosts; when its clients take part in several runs,
the runs' tasks take turns on it (`RoundRobin`). Each logical client runs its own loop and
survives its own failures (see `Worker`); only a refused token ends one.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Executor, ThreadPoolExecutor
from functools import partial
from typing import Any, TypeVar

import httpx

from client.config import ClientSettings
from client.dvfs import Pacer, backend_for, emulated_hold, record_bytes
from client.state import ClientStateStore
from shared.algorithms import registry
from shared.backoff import Backoff
from shared.config import RunConfig
from shared.data.datasets import load_client
from shared.federation import local_job
from shared.log import bind
from shared.schemas import ClientFailureReport, ClientRegistration, ClientResultHeader, ClientTaskHeader
from shared.transport.http import binary_body
from shared.transport.records import Record, decode, encode
from shared.transport.retry import DEDUPLICATED

log = logging.getLogger(__name__)
T = TypeVar("T")


def compute(settings: ClientSettings, header: ClientTaskHeader, task: Record) -> bytes:
    """Runs the algorithm's local update for one task and returns the result message, state saved."""
    store = ClientStateStore(settings.state_dir, header.run_id, header.client_id)
    saved = store.saved_result(header.task_id)
    if saved is not None:  # we crashed after training but before the upload was acknowledged
        return saved
    config = _local_config(settings, header.config)
    algorithm = registry.create(config)
    data = load_client(config.data, config.seed, header.client_id)
    started = time.perf_counter()
    pacer = Pacer(config, header.client_id, len(data.train), header.budget_s, record_bytes(task),
                  backend_for(settings.dvfs_backend, settings.cpufreq_root))
    with pacer.installed():  # DVFS before each local epoch (client/dvfs.py)
        update = algorithm.local_update(local_job(config, header.client_id, header.round, data), task, store.load())
    result = ClientResultHeader(task_id=header.task_id, client_id=header.client_id,
                                num_samples=update.num_samples, loss=update.loss, metrics=update.metrics,
                                train_seconds=time.perf_counter() - started,
                                device=pacer.finish(record_bytes(update.tensors)))
    blob = encode(update.tensors, result)
    store.save(header.task_id, update.state, blob)
    return blob


def _local_config(settings: ClientSettings, config: RunConfig) -> RunConfig:
    if settings.data_path and config.data.dataset == "npz":
        data = config.data.model_copy(update={"path": settings.data_path})
        return config.model_copy(update={"data": data})
    return config


class ClientStopped(Exception):
    """A failure that retrying cannot heal (the edge refuses this client's token): ends that logical client."""


class ClientsStopped(RuntimeError):
    """Every logical client of the process stopped for good: what `Worker.run` raises (exit code 1 in main)."""


class _Unregistered(Exception):
    """The edge does not know this client (404: it restarted and lost its registrations)."""


def _check(response: httpx.Response, *, unknown_client: bool = True) -> None:
    """Raises ClientStopped for a refused token, _Unregistered for 404, HTTPStatusError for other errors."""
    if response.status_code in (401, 403):
        raise ClientStopped(f"the edge refuses this client's token (HTTP {response.status_code}: "
                            f"{response.text[:200]}); check FL_CLIENT_CLIENT_TOKEN or its entry in "
                            "FL_CLIENT_CLIENT_TOKENS")
    if response.status_code == 404 and unknown_client:
        raise _Unregistered()
    response.raise_for_status()


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
    """Serves each logical client in its own loop: one client's failure never ends another's.

    A failure (edge unreachable or answering an error, a malformed task, a bug) is logged with the client's
    id, and that client alone waits (`retry_initial_s` doubling up to `retry_max_s`, reset by a success)
    and goes on. Only a refused token (401/403) ends a client; `run` raises ClientsStopped once every
    client of the process has ended. Cancellation (SIGTERM, Ctrl-C) propagates at once.
    """

    def __init__(self, settings: ClientSettings, client_ids: list[int], edge: httpx.AsyncClient):
        self.settings = settings
        self.client_ids = client_ids
        self.edge = edge
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="train")
        # One training at a time for the whole process, the runs taking turns.
        self.trainer = RoundRobin(self.executor)
        self.completed = 0
        # Tasks whose training raised (e.g. diverged to NaN): the same inputs would fail again, so
        # they are not retried; the edge treats the client as dropped for that round.
        self.failed: set[str] = set()
        # Logical clients ended for good, with the reason.
        self.stopped: dict[int, str] = {}
        # Each logical client speaks with its own token (client_tokens) where it has one: a revoked one ends
        # that client alone.
        self.auth = {k: {"Authorization": f"Bearer {settings.token_of(k)}"} for k in client_ids}

    async def run(self) -> None:
        """Serves until cancelled; raises ClientsStopped when every logical client has stopped for good."""
        await asyncio.gather(*(self.serve(k) for k in self.client_ids))
        reasons = "; ".join(f"client {k}: {why}" for k, why in sorted(self.stopped.items()))
        raise ClientsStopped(f"every logical client of this process stopped for good ({reasons})")

    async def register(self, client_id: int) -> None:
        reg = ClientRegistration(client_id=client_id, capabilities={"torch_threads": self.settings.torch_threads})
        # Re-sent through a passing fault: a registration repeated replaces itself.
        response = await self.edge.post("/api/v1/clients", json=reg.model_dump(), headers=self.auth[client_id],
                                        extensions=DEDUPLICATED)
        _check(response, unknown_client=False)  # a 404 here is a wrong edge URL, not a lost registration

    async def serve(self, client_id: int) -> None:
        """One logical client's loop; returns only when the client stops for good (see ClientStopped)."""
        backoff = Backoff(self.settings.retry_initial_s, self.settings.retry_max_s)
        registered = False
        bind(client_id=client_id)  # this logical client's task only
        while True:
            try:
                if not registered:
                    await self.register(client_id)
                    registered = True
                await self.step(client_id)
                backoff.reset()
            except ClientStopped as exc:
                log.error("client %d: stopped for good: %s", client_id, exc)
                self.stopped[client_id] = str(exc)
                return
            except _Unregistered:
                registered = False
                first = backoff.failures == 0
                delay = backoff.next()
                # Re-register at once the first time; again and again without a success in between: back off.
                log.warning("client %d: unknown to the edge (restarted?); registering again in %.3gs",
                            client_id, 0.0 if first else delay)
                if not first:
                    await asyncio.sleep(delay)
            except Exception as exc:  # never CancelledError (a BaseException): a stop still ends every client
                delay = backoff.next()
                log.error("client %d: %s: %s; retrying in %.3gs", client_id, type(exc).__name__, exc, delay,
                          exc_info=backoff.failures == 1)  # the traceback once per run of failures
                await asyncio.sleep(delay)

    async def step(self, client_id: int) -> None:
        """One long-poll for a task and, if one came, its local update and upload."""
        response = await self.edge.get(f"/api/v1/clients/{client_id}/task", headers=self.auth[client_id],
                                       params={"timeout": self.settings.long_poll_s})
        _check(response)
        if response.status_code == 204:
            return
        task, header = decode(response.content, ClientTaskHeader)
        bind(run_id=header.run_id)
        if header.task_id in self.failed:
            await asyncio.sleep(1.0)  # still open at the edge until its deadline; do not spin
            return
        received = time.monotonic()
        try:
            blob = await self.trainer.run(header.run_id, partial(compute, self.settings, header, task))
        except Exception as exc:
            log.exception("client %d: task %s failed; skipping it", client_id, header.task_id)
            self.failed.add(header.task_id)
            await self.report_failure(client_id, header, exc)
            return
        # An emulated device takes its modelled time (DVFS): waited here, not on the shared training thread.
        await asyncio.sleep(emulated_hold(header.config, blob, time.monotonic() - received))
        await self.upload(client_id, header, blob)
        log.debug("client %d: task %s done", client_id, header.task_id)

    async def report_failure(self, client_id: int, header: ClientTaskHeader, exc: Exception) -> None:
        """Tells the edge why the task cannot be trained here (e.g. the run's model package is missing from
        this environment): the round stops waiting for this client and its record shows the reason."""
        report = ClientFailureReport(task_id=header.task_id, client_id=client_id,
                                     error=f"{type(exc).__name__}: {exc}"[:1000])
        # Re-sent through a passing fault: a repeated report of the same task's failure records it again.
        response = await self.edge.post(f"/api/v1/clients/{client_id}/failures", json=report.model_dump(),
                                        headers=self.auth[client_id], extensions=DEDUPLICATED)
        if response.status_code >= 400:  # e.g. 409: the round moved on meanwhile; the log above says why
            log.warning("client %d: edge did not take the failure report of task %s: %s %s", client_id,
                        header.task_id, response.status_code, response.text[:300])

    async def upload(self, client_id: int, header: ClientTaskHeader, blob: bytes) -> None:
        # Re-sent through a passing fault: the edge accepts one result per task id and answers a repeat 409.
        response = await self.edge.post(f"/api/v1/clients/{client_id}/results",
                                        **binary_body(blob, self.auth[client_id]), extensions=DEDUPLICATED)
        if response.status_code == 409:
            # Already accepted (a retried upload) or the round moved on: nothing left to do either way.
            log.info("client %d: task %s: %s", client_id, header.task_id, _detail(response))
        elif response.status_code in (401, 403, 404):
            # After re-registering, the task comes back and its stored result is sent without retraining.
            _check(response)
        elif response.status_code >= 400:
            # E.g. a diverged update beyond the edge's bounds (422): the same result would be refused again,
            # so it is not re-sent (it was, at once and forever); the edge drops the client for that round.
            log.error("client %d: edge refused task %s: %s %s", client_id, header.task_id,
                      response.status_code, response.text[:300])
            self.failed.add(header.task_id)
        else:
            self.completed += 1
