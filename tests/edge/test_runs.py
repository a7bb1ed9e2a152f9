"""The edge's task board with several runs: a client holds one task per run and fetches the oldest first,
and each run's results, failures and clearing are its own."""
from __future__ import annotations

import asyncio
from functools import partial

import pytest

from fl_services.edge.tasks import Task, TaskBoard
from fl_services.shared.core.records import check, spec_of
from fl_services.shared.wire.client_edge import (
    ClientFailureReport,
    ClientRegistration,
    ClientResultHeader,
    ClientTaskHeader,
)
from tests.edge.harness import CONFIG, task_record

pytestmark = pytest.mark.anyio


def task(run_id: str, client_id: int, round_: int = 0) -> Task:
    tensors = task_record(client_id)
    header = ClientTaskHeader(task_id=f"{run_id}-r{round_}-e0-c{client_id}", run_id=run_id, client_id=client_id,
                              round=round_, version=round_, config=CONFIG)
    return Task(header, tensors, partial(check, expected=spec_of(tensors)))


async def answer(board: TaskBoard, client_id: int) -> str:
    found = await board.fetch(client_id, timeout=0)
    assert found is not None
    result = ClientResultHeader(task_id=found.header.task_id, client_id=client_id, num_samples=3, loss=0.1)
    await board.accept(client_id, result, found.tensors)
    return found.header.run_id


async def test_a_client_serves_its_runs_in_turn() -> None:
    board = TaskBoard()
    for k in (0, 1):
        board.register(ClientRegistration(client_id=k))
    await board.post([task("a", 0), task("a", 1)])
    await board.post([task("b", 0)])
    assert await answer(board, 0) == "a"  # posted first
    await board.post([task("a", 0, round_=1), task("a", 1, round_=1)])  # a's next round, while b waits
    assert [await answer(board, 0) for _ in range(2)] == ["b", "a"]
    assert await board.fetch(0, timeout=0) is None
    assert [r.client_id for r in board.results("a")] == [0] and [r.client_id for r in board.results("b")] == [0]
    assert board.outstanding() == 1  # client 1's task of a's round 1
    await board.clear("b")
    assert board.results("b") == [] and [r.client_id for r in board.results("a")] == [0]
    assert await answer(board, 1) == "a"
    assert len(board.results()) == 2 and await board.wait_results("a", timeout=0) == board.results("a")


async def test_a_task_reported_failed_does_not_keep_the_clients_other_runs_waiting() -> None:
    """It stayed the client's oldest open task: every fetch returned it again, and 16 runs at once stalled
    behind one whose tasks failed (an outside probe), until that run was stopped."""
    board = TaskBoard()
    board.register(ClientRegistration(client_id=1))
    await board.post([task("a", 1)])
    await board.post([task("b", 1)])
    await board.report_failure(1, ClientFailureReport(task_id="a-r0-e0-c1", client_id=1, error="boom"))
    assert await answer(board, 1) == "b"
    assert await board.fetch(1, timeout=0) is None
    assert [f.client_id for f in board.failures("a")] == [1]  # the round still hears of the failure
    assert await board.fetch_many([1], set(), timeout=0) == []  # nor by the batch poll of a restarted process


async def test_a_round_waiting_for_k_answers_returns_at_the_kth() -> None:
    board = TaskBoard()
    for k in (0, 1, 2):
        board.register(ClientRegistration(client_id=k))
    await board.post([task("a", k) for k in (0, 1, 2)])
    waiting = asyncio.create_task(board.wait_results("a", timeout=60, enough=2))
    await answer(board, 2)
    await asyncio.sleep(0)
    assert not waiting.done()
    await answer(board, 0)
    assert [r.client_id for r in await asyncio.wait_for(waiting, 10)] == [0, 2]
    await board.clear("a")  # the round closed: client 1's answer is no longer taken
    assert await board.fetch(1, timeout=0) is None
