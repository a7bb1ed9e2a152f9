"""A client process trains one task at a time, its runs taking turns."""
from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from fl_services.client.worker import RoundRobin

pytestmark = pytest.mark.anyio


async def test_runs_take_turns_on_the_one_training_thread() -> None:
    order: list[str] = []
    gate = threading.Event()
    running = 0
    most = 0
    lock = threading.Lock()

    def job(name: str) -> str:
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
        if name == "first":
            assert gate.wait(5)
        order.append(name)
        with lock:
            running -= 1
        return name

    with ThreadPoolExecutor(max_workers=4) as executor:  # more threads than the one job at a time
        trainer = RoundRobin(executor)
        first = asyncio.create_task(trainer.run("a", lambda: job("first")))
        await asyncio.sleep(0.05)
        # Queued while the first trains: four of run a, then two of run b, then one of run c.
        queued = [asyncio.create_task(trainer.run(run, lambda n=f"{run}{k}": job(n)))
                  for run, count in (("a", 4), ("b", 2), ("c", 1)) for k in range(count)]
        await asyncio.sleep(0.05)
        gate.set()
        results = await asyncio.gather(first, *queued)
    assert results[0] == "first" and sorted(results[1:]) == sorted(order[1:])
    assert order == ["first", "a0", "b0", "c0", "a1", "b1", "a2", "a3"]
    assert most == 1


async def test_a_failing_job_fails_its_caller_only_and_a_cancelled_one_never_runs() -> None:
    ran: list[str] = []
    gate = threading.Event()

    def blocked() -> None:
        assert gate.wait(5)
        ran.append("blocked")

    def fails() -> None:
        ran.append("fails")
        raise ValueError("diverged")

    with ThreadPoolExecutor(max_workers=1) as executor:
        trainer = RoundRobin(executor)
        first = asyncio.create_task(trainer.run("a", blocked))
        await asyncio.sleep(0.05)
        cancelled = asyncio.create_task(trainer.run("b", lambda: ran.append("cancelled")))
        failing = asyncio.create_task(trainer.run("c", fails))
        after = asyncio.create_task(trainer.run("a", lambda: ran.append("after") or "ok"))
        await asyncio.sleep(0.05)
        cancelled.cancel()
        gate.set()
        await first
        with pytest.raises(ValueError, match="diverged"):
            await failing
        assert await after == "ok"
    assert ran == ["blocked", "fails", "after"]
