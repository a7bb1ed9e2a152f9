"""The edge's task board: one open task per selected client, fetched by long-poll, answered once.

A task keeps its id across re-runs of a round, so a client that restarts (or a retried upload) meets
the same task; results are checked against the algorithm's result spec before they are accepted.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Callable

from shared.algorithms.base import ClientResult
from shared.longpoll import wait_until
from shared.schemas import ClientFailure, ClientFailureReport, ClientRegistration, ClientResultHeader, ClientTaskHeader
from shared.transport.records import Record, encode
from shared.transport.tensors import InvalidContent


class TaskConflict(Exception):
    """A stale or duplicate result (HTTP 409)."""

    def __init__(self, message: str, reason: str):
        super().__init__(message)
        self.reason = reason  # "stale" or "duplicate": the refusal's name in the metrics (edge/metrics.py)


class UnknownClient(Exception):
    """A client id that never registered (HTTP 404)."""


class ForeignClient(Exception):
    """A client id this edge does not serve in the current run (HTTP 409)."""


@dataclass
class Task:
    header: ClientTaskHeader
    tensors: Record
    check: Callable[[Record], None]  # the algorithm's check_result for this task; raises InvalidContent
    result: ClientResult | None = None
    # What the client reported when it could not train the task; a later result still answers it (the
    # client process restarted with what it lacked).
    failure: str | None = None
    # The client's training sample count where the edge knows it (shared.federation.known_num_samples): a
    # result must claim exactly this. Where it does not, `max_samples` (the edge's max_client_samples) caps
    # what a claim weighs. Unchecked, one device claiming 10^12 samples took 0.999999999 of the weight.
    num_samples: int | None = None
    max_samples: int | None = None
    _blob: bytes | None = field(default=None, repr=False)

    def counted_samples(self, claimed: int) -> int:
        """The sample count the result's weight uses; raises InvalidContent (422) for a wrong claim."""
        if self.num_samples is not None and claimed != self.num_samples:
            raise InvalidContent(f"num_samples {claimed} is not client {self.header.client_id}'s: this run gives it "
                                 f"{self.num_samples} training samples")
        return claimed if self.max_samples is None else min(claimed, self.max_samples)

    def blob(self) -> bytes:
        # Encoded on first fetch, not at dispatch: a hundred idle clients cost no copies.
        if self._blob is None:
            self._blob = encode(self.tensors, self.header)
        return self._blob


class TaskBoard:
    def __init__(self) -> None:
        self.clients: dict[int, ClientRegistration] = {}
        self._tasks: dict[int, Task] = {}
        self._changed = asyncio.Condition()
        self._closing = False

    # ---- clients -------------------------------------------------------------------------------
    def register(self, reg: ClientRegistration) -> None:
        self.clients[reg.client_id] = reg

    def keep_only(self, client_ids: set[int]) -> None:
        """Forgets the registrations of other clients (they hear 404, register again and are refused)."""
        self.clients = {k: reg for k, reg in self.clients.items() if k in client_ids}

    def _known(self, client_id: int) -> None:
        if client_id not in self.clients:
            raise UnknownClient(f"unknown client {client_id}; register first")

    # ---- round side ----------------------------------------------------------------------------
    async def post(self, tasks: list[Task]) -> None:
        async with self._changed:
            self._tasks = {t.header.client_id: t for t in tasks}
            self._changed.notify_all()

    async def clear(self) -> None:
        async with self._changed:
            self._tasks = {}

    async def close(self) -> None:
        """The edge is stopping: every waiting and future fetch answers "no task" at once."""
        async with self._changed:
            self._closing = True
            self._changed.notify_all()

    def outstanding(self) -> int:
        """Tasks posted and not answered yet."""
        return sum(1 for t in self._tasks.values() if t.result is None)

    def results(self) -> list[ClientResult]:
        return [t.result for t in self._tasks.values() if t.result is not None]

    def failures(self) -> list[ClientFailure]:
        return [ClientFailure(client_id=k, error=t.failure) for k, t in sorted(self._tasks.items())
                if t.result is None and t.failure is not None]

    async def wait_results(self, timeout: float, failures_settle: bool = True) -> list[ClientResult]:
        """Returns when every task is answered (or, if `failures_settle`, reported failed: no point waiting
        for those) or at the deadline, with what has arrived."""
        await wait_until(self._changed, lambda: all(
            t.result is not None or (failures_settle and t.failure is not None) for t in self._tasks.values()),
            timeout)
        return self.results()

    # ---- client side ---------------------------------------------------------------------------
    async def fetch(self, client_id: int, timeout: float) -> Task | None:
        self._known(client_id)
        await wait_until(self._changed, lambda: self._open_task(client_id) is not None or self._closing, timeout)
        return self._open_task(client_id)

    def _open_task(self, client_id: int) -> Task | None:
        task = self._tasks.get(client_id)
        return task if task is not None and task.result is None else None

    def task_for(self, client_id: int, task_id: str) -> Task:
        """The open task a result answers; raises for unknown, stale or duplicate results."""
        self._known(client_id)
        task = self._tasks.get(client_id)
        if task is None or task.header.task_id != task_id:
            raise TaskConflict(f"stale result: task {task_id!r} is not open for client {client_id}", "stale")
        if task.result is not None:
            raise TaskConflict(f"duplicate result for task {task_id!r}", "duplicate")
        return task

    async def accept(self, client_id: int, header: ClientResultHeader, tensors: Record) -> None:
        """Checks a result on a worker thread (CPU-bound: it reads every value), then records it on the loop,
        which alone touches the board, if its task is still the open one."""
        task = self.task_for(client_id, header.task_id)
        task.counted_samples(header.num_samples)  # a wrong claim is refused before the tensors are read
        while True:
            await asyncio.to_thread(task.check, tensors)
            async with self._changed:
                # Anything may have happened during the check: an identical retry answered the task (409
                # duplicate), the round ended (409 stale), or it was posted again with the same task id.
                current = self.task_for(client_id, header.task_id)
                if current is task:
                    task.result = ClientResult(client_id, task.counted_samples(header.num_samples), header.loss,
                                               tensors, header.metrics)
                    self._changed.notify_all()
                    return
            task = current  # posted again while the check ran: check against the task now open

    async def report_failure(self, client_id: int, report: ClientFailureReport) -> None:
        """Records that the client could not train its open task (409 if stale or already answered)."""
        async with self._changed:
            self.task_for(client_id, report.task_id).failure = report.error
            self._changed.notify_all()
