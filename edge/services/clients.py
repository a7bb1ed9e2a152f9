"""What the edge does for its clients: registers them, hands them their tasks, takes their results."""
from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass

from fl_services.edge.metrics import EdgeMetrics
from fl_services.edge.round_loop import EdgeRoundLoop
from fl_services.edge.tasks import TaskBoard, TaskConflict, UnknownClient
from fl_services.shared.core.records import Record, decode
from fl_services.shared.core.tensors import InvalidContent, PayloadError
from fl_services.shared.server.metrics import refusal_reason
from fl_services.shared.wire import bundle
from fl_services.shared.wire.bundle import BundleItem
from fl_services.shared.wire.client_edge import ClientRegistration, ClientResultHeader, ResultOutcome, TaskPoll
from fl_services.shared.wire.protocol import LIVE_RUNS, REFUSED_CLIENTS, UNKNOWN_CLIENTS


def register(*, board: TaskBoard, loop: EdgeRoundLoop, registration: ClientRegistration,
             token_id: str | None = None) -> None:
    """Registers a client of this edge (ForeignClient for one it serves in none of its runs), with the id of the
    device token it registered with (None: the edge's client secret). The cloud hears of it soon (a site report)."""
    loop.check_own_client(registration.client_id)
    board.register(registration, token_id)


@dataclass(frozen=True)
class TaskReply:
    """A batch poll's answer: the tasks as a bundle (None: none before the timeout), and its headers."""

    bundle: bytes | None
    headers: dict[str, str]


async def poll_tasks(*, board: TaskBoard, loop: EdgeRoundLoop, poll: TaskPoll, refused: list[int], wait_s: float,
                     hold: Callable[[int], AbstractAsyncContextManager[None]]) -> TaskReply:
    """Every open task of the polled clients but the `refused` ones and those the process holds, waiting up to
    `wait_s` for one while `hold(first served client)` is held. Ids the edge does not know are named in
    X-FL-Unknown-Clients, the refused ones in X-FL-Refused-Clients, and the live runs (once the cloud has named
    them) in X-FL-Live-Runs, so that the process deletes the other runs' state."""
    served = [k for k in poll.client_ids if k not in refused]
    unknown = [k for k in served if k not in board.clients]
    # With clients to register again (the edge restarted), the process hears of them at once, not after the wait.
    timeout = 0 if unknown or refused else wait_s
    # Counted with the per-client long-polls of its first id: a device (its token names one id) holds at most
    # max_open_per_caller polls by either route; a process of many ids holds one.
    async with hold(served[0]):
        found = await board.fetch_many(served, set(poll.holding), timeout)
    headers = {name: ",".join(map(str, ids)) for name, ids in ((UNKNOWN_CLIENTS, unknown), (REFUSED_CLIENTS, refused))
               if ids}
    if loop.live_runs is not None:
        headers[LIVE_RUNS] = ",".join(sorted(loop.live_runs))
    if not found:
        return TaskReply(None, headers)
    body = await asyncio.to_thread(lambda: bundle.pack([(t.header.client_id, t.header.task_id, *t.parts())
                                                        for t in found]))
    return TaskReply(body, headers)


async def accept_result(*, board: TaskBoard, metrics: EdgeMetrics, header: ClientResultHeader, tensors: Record) -> None:
    """Takes a client's result for its open task (InvalidContent, TaskConflict or UnknownClient: refused), and
    counts the training it reports."""
    await board.accept(header.client_id, header, tensors)  # checks the tensors on a worker thread too
    metrics.trained(header)


# A result bundle's refusals, each with the status the per-client route answers it with (edge/app.py's errors).
_STATUS = ((InvalidContent, 422), (PayloadError, 400), (UnknownClient, 404), (TaskConflict, 409))


def _refused(metrics: EdgeMetrics, item: BundleItem, exc: Exception) -> ResultOutcome:
    """The outcome of a refused result, counted as the per-client route counts it (a conflict by its reason)."""
    status = next(code for kind, code in _STATUS if isinstance(exc, kind))
    metrics.refused.labels(refusal_reason(status, exc.reason if isinstance(exc, TaskConflict) else None)).inc()
    return ResultOutcome(client_id=item.client_id, task_id=item.task_id, status=status, detail=str(exc)[:1000])


def _read(item: BundleItem) -> tuple[Record, ClientResultHeader]:
    """One result of a bundle, decoded and checked against the names the bundle gives it (PayloadError,
    InvalidContent)."""
    tensors, header = decode(item.message(), ClientResultHeader)
    if (header.client_id, header.task_id) != (item.client_id, item.task_id):
        raise InvalidContent(f"the bundle names task {item.task_id!r} of client {item.client_id}, its result "
                             f"task {header.task_id!r} of client {header.client_id}")
    return tensors, header


async def accept_results(*, board: TaskBoard, metrics: EdgeMetrics, items: list[BundleItem],
                         over_rate: Callable[[int], Awaitable[str | None]]) -> list[ResultOutcome]:
    """Takes a result bundle's results, each on its own as the per-client route takes one: a refused result
    refuses nothing else. One outcome per item, in order. `over_rate(client_id)` says why a client is over its
    rate of results (None: it is not): its results are refused with 429."""
    outcomes: list[ResultOutcome | None] = [None] * len(items)
    over = {k: why for k in dict.fromkeys(item.client_id for item in items) if (why := await over_rate(k)) is not None}
    for i, item in enumerate(items):
        if item.client_id in over:
            metrics.refused.labels(refusal_reason(429, None)).inc()
            outcomes[i] = ResultOutcome(client_id=item.client_id, task_id=item.task_id, status=429,
                                        detail=over[item.client_id])

    def read_all() -> list[tuple[int, tuple[Record, ClientResultHeader] | PayloadError]]:
        read: list[tuple[int, tuple[Record, ClientResultHeader] | PayloadError]] = []
        for i, item in enumerate(items):
            if outcomes[i] is None:
                try:
                    read.append((i, _read(item)))
                except PayloadError as exc:  # InvalidContent too
                    read.append((i, exc))
        return read

    readable = []
    for i, got in await asyncio.to_thread(read_all):  # decoding copies every tensor: not on the loop
        if isinstance(got, PayloadError):
            outcomes[i] = _refused(metrics, items[i], got)
        else:
            readable.append((i, *got))
    refusals = await board.accept_many([(items[i].client_id, header, tensors) for i, tensors, header in readable])
    for (i, _, header), refusal in zip(readable, refusals, strict=True):
        if refusal is None:
            metrics.trained(header)
            metrics.results.inc()
            outcomes[i] = ResultOutcome(client_id=header.client_id, task_id=header.task_id, status=202)
        else:
            outcomes[i] = _refused(metrics, items[i], refusal)
    return [outcome for outcome in outcomes if outcome is not None]
