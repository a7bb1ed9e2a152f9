"""What the edge does for its clients: registers them, hands them their tasks, takes their results."""
from __future__ import annotations

import asyncio
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass

from fl_services.edge.metrics import EdgeMetrics
from fl_services.edge.round_loop import EdgeRoundLoop
from fl_services.edge.tasks import TaskBoard
from fl_services.shared.core.records import Record
from fl_services.shared.wire import bundle
from fl_services.shared.wire.client_edge import ClientRegistration, ClientResultHeader, TaskPoll
from fl_services.shared.wire.protocol import LIVE_RUNS, REFUSED_CLIENTS, UNKNOWN_CLIENTS


def register(*, board: TaskBoard, loop: EdgeRoundLoop, registration: ClientRegistration,
             token_id: str | None = None) -> None:
    """Registers a client of this edge (ForeignClient for one it serves in none of its runs), with the id of the
    device token it registered with (None: the edge's client secret)."""
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
