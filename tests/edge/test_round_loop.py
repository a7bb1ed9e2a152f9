"""The edge's round loop against an in-process cloud (tests/edge/harness.py, CloudDouble): a failed round is
fetched again and re-run from the edge state it started with, with a bounded backoff; its CPU work runs
off the event loop; and once the run is known the edge registers only its own clients."""
from __future__ import annotations

import asyncio
import logging
import threading
import time
from functools import partial

import httpx
import pytest
import torch

from fl_services.cloud.config import CloudSettings
from fl_services.edge.config import EdgeSettings
from fl_services.edge.round_loop import EdgeRoundLoop
from fl_services.edge.tasks import Task, TaskBoard
from fl_services.shared.core.algorithms import registry
from fl_services.shared.core.algorithms.hfpl import CLIENTS, ClientMemory
from fl_services.shared.core.config import RunConfig
from fl_services.shared.core.records import decode_state, flatten, unflatten, unpack
from fl_services.shared.core.tensors import check_tensors, spec_of
from fl_services.shared.server import bodies
from fl_services.shared.wire.client_edge import ClientRegistration, ClientResultHeader, ClientTaskHeader
from fl_services.shared.wire.edge_cloud import GlobalStateHeader
from tests.edge import test_hfpl_endpoints as hfpl
from tests.edge.harness import (
    CONFIG,
    RUN_ID,
    CloudDouble,
    answer_tasks,
    auth,
    result,
    running_edge,
    task_id,
    task_tensors,
    true_samples,
    until,
)
from tests.web import detail_of

pytestmark = pytest.mark.anyio

FAST = CONFIG.model_copy(update={"policy": CONFIG.policy.model_copy(update={"deadline_s": 5.0})})


def failures(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "fl_services.edge.round_loop" and r.levelno >= logging.ERROR]


# =================================================================================================
# A failed round is re-run
# =================================================================================================
async def test_a_failed_round_is_fetched_again_and_rerun(tmp_path, caplog) -> None:
    """The first attempt cannot save the edge state (its directory's parent is a file): the edge must
    ask for the same version again, re-run the round and submit once, instead of waiting for a newer one."""
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    cloud = CloudDouble(FAST)
    async with running_edge(cloud_transport=cloud.transport(), state_dir=blocker / "state") as edge:
        clients = asyncio.create_task(answer_tasks(edge, range(FAST.data.num_clients)))
        try:
            await until(lambda: failures(caplog), what="the first attempt fails")
            assert "round at version 0" in failures(caplog)[0].getMessage()
            assert isinstance(failures(caplog)[0].exc_info[1], OSError)
            assert cloud.contributions == []
            blocker.unlink()  # the disk is back
            await until(lambda: cloud.contributions, what="the round is re-run and submitted")
            await asyncio.sleep(0.3)  # and then nothing more: version 0 is done
        finally:
            clients.cancel()
    assert [(c.base_version, c.idempotency_key) for c in cloud.contributions] == [(0, f"{RUN_ID}:0:0")]
    assert sorted(p.client_id for p in cloud.contributions[0].clients) == list(range(FAST.data.num_clients))
    assert len(failures(caplog)) == 1
    first_success = cloud.polls.index(0)
    assert cloud.polls[:first_success] == [-1, -1] and set(cloud.polls[first_success:]) == {0}
    assert (blocker / "state" / f"edge0-{RUN_ID}.safetensors").is_file()


async def test_failures_back_off_exponentially_up_to_a_cap_and_reset_after_a_success(caplog, monkeypatch) -> None:
    monkeypatch.setattr(EdgeRoundLoop, "retry_backoff_s", 0.02)
    monkeypatch.setattr(EdgeRoundLoop, "retry_backoff_max_s", 0.05)
    cloud = CloudDouble(FAST)
    cloud.broken_answers = 3
    async with running_edge(cloud_transport=cloud.transport(), state_dir=None) as edge:
        clients = asyncio.create_task(answer_tasks(edge, range(FAST.data.num_clients)))
        try:
            await until(lambda: cloud.contributions, what="the round runs once the state arrives")
            cloud.broken_answers = 2
            await until(lambda: len(failures(caplog)) == 5, what="two more failed fetches")
        finally:
            clients.cancel()
    waits = [r.args[-1] for r in failures(caplog)]
    assert waits == [0.02, 0.04, 0.05, 0.02, 0.04]
    assert all("fetching a global state failed" in r.getMessage() for r in failures(caplog))
    assert len(cloud.contributions) == 1


async def test_a_failed_round_leaves_the_edge_state_it_started_with(tmp_path) -> None:
    """hfpl keeps every client's last prototypes in the edge state: a round that fails after edge_aggregate
    changed it (here: saving it) must leave the state the round started from, as a restarted edge has."""
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    cloud = CloudDouble(hfpl.CONFIG)
    board = TaskBoard()
    async with httpx.AsyncClient(transport=cloud.transport(), base_url="http://cloud") as http:
        loop = EdgeRoundLoop(EdgeSettings(edge_id=0, state_dir=blocker / "state"), http, board)
        header = GlobalStateHeader(run_id=RUN_ID, version=0, config=hfpl.CONFIG)
        mine = hfpl.CONFIG.clients_of_edge(0)

        async def clients() -> None:
            for k in mine:
                board.register(ClientRegistration(client_id=k))
            while True:
                for k in mine:
                    task = await board.fetch(k, timeout=0.05)
                    if task is not None:
                        answer = ClientResultHeader(task_id=task.header.task_id, client_id=k,
                                                    num_samples=true_samples(hfpl.CONFIG, k), loss=0.1)
                        await board.accept(k, answer, unflatten(hfpl.answer()))

        answering = asyncio.create_task(clients())
        try:
            lane = loop.lane(header)
            before = lane.edge_state
            with pytest.raises(OSError):
                await loop.run_round(header, cloud.global_)
            assert lane.edge_state is before and before == {}
            assert cloud.contributions == []
            blocker.unlink()
            await loop.run_round(header, cloud.global_)  # the re-run
        finally:
            answering.cancel()
    assert [c.weight for c in cloud.contributions] == [len(mine)]
    saved = decode_state((blocker / "state" / f"edge0-{RUN_ID}.safetensors").read_bytes())
    assert sorted(saved) == sorted(lane.edge_state) and mine[-1] in unpack(saved[CLIENTS], ClientMemory)


# =================================================================================================
# CPU-bound work off the event loop
# =================================================================================================
async def test_round_tensor_work_runs_off_the_event_loop(monkeypatch) -> None:
    """client_task and edge_aggregate run on a worker thread: the loop keeps answering meanwhile. The
    aggregation does not return until the loop has beaten three times since it began, which a blocked loop
    never does, however fast or loaded the machine."""
    fedavg = registry.get_algorithm_class("fedavg")
    threads: dict[str, set[int]] = {"client_task": set(), "edge_aggregate": set()}
    beats = 0
    beaten_while_aggregating: list[bool] = []

    def spy(name: str, wait_for_beats: bool = False):
        original = getattr(fedavg, name)

        def hook(self, *args, **kwargs):
            threads[name].add(threading.get_ident())
            if wait_for_beats:  # a long aggregation, as with a large model
                start, deadline = beats, time.monotonic() + 30
                while beats < start + 3 and time.monotonic() < deadline:
                    time.sleep(0.01)
                beaten_while_aggregating.append(beats >= start + 3)
            return original(self, *args, **kwargs)
        return hook

    monkeypatch.setattr(fedavg, "client_task", spy("client_task"))
    monkeypatch.setattr(fedavg, "edge_aggregate", spy("edge_aggregate", wait_for_beats=True))
    cloud = CloudDouble(FAST)

    async def heartbeat() -> None:
        nonlocal beats
        while True:
            await asyncio.sleep(0.01)
            beats += 1

    async with running_edge(cloud_transport=cloud.transport(), state_dir=None) as edge:
        clients = asyncio.create_task(answer_tasks(edge, range(FAST.data.num_clients)))
        beating = asyncio.create_task(heartbeat())
        try:
            await until(lambda: cloud.contributions, timeout=60, what="the round is submitted")
        finally:
            clients.cancel()
            beating.cancel()
    loop_thread = threading.get_ident()
    assert threads["client_task"] and threads["edge_aggregate"]
    assert loop_thread not in threads["client_task"] | threads["edge_aggregate"], threads
    assert beaten_while_aggregating and all(beaten_while_aggregating), "the event loop stalled while aggregating"


async def test_result_decoding_and_checks_run_off_the_event_loop(edge, monkeypatch) -> None:
    seen: list[tuple[str, int]] = []
    real_decode = bodies.decode

    def decode(*args, **kwargs):
        seen.append(("decode", threading.get_ident()))
        return real_decode(*args, **kwargs)

    def check(tensors):
        seen.append(("check", threading.get_ident()))
        check_tensors(flatten(tensors), spec_of(task_tensors(0)))

    monkeypatch.setattr(bodies, "decode", decode)
    await edge.register(0)
    header = ClientTaskHeader(task_id=task_id(0), run_id=RUN_ID, client_id=0, round=0, version=0, config=CONFIG)
    await edge.board.post([Task(header, unflatten(task_tensors(0)), check)])
    r = await edge.send_result(0, result(0))
    assert r.status_code == 202, r.text
    assert [name for name, _ in seen] == ["decode", "check"]
    assert threading.get_ident() not in {ident for _, ident in seen}
    assert [x.client_id for x in edge.board.results()] == [0]


@pytest.mark.parametrize("meanwhile", ["posted-again", "round-ended"])
async def test_a_result_checked_while_its_round_changes(edge, meanwhile: str) -> None:
    """The check runs on a thread, so the board may change before the result is recorded: a task posted
    again (same id, a re-run round) is answered after a check against it; a task that is gone gets 409."""
    checking, release, checks = threading.Event(), threading.Event(), []

    def slow_check(tensors):
        checks.append("first")
        checking.set()
        assert release.wait(5)
        check_tensors(flatten(tensors), spec_of(task_tensors(0)))

    def task(check) -> Task:
        header = ClientTaskHeader(task_id=task_id(0), run_id=RUN_ID, client_id=0, round=0, version=0, config=CONFIG)
        return Task(header, unflatten(task_tensors(0)), check)

    await edge.register(0)
    await edge.board.post([task(slow_check)])
    sending = asyncio.create_task(edge.send_result(0, result(0)))
    await until(checking.is_set, what="the check started")
    if meanwhile == "posted-again":
        again = task(partial(lambda tensors: checks.append("again")))
        await edge.board.post([again])
    else:
        await edge.board.clear()
    release.set()
    r = await sending
    if meanwhile == "posted-again":
        assert r.status_code == 202, r.text
        assert checks == ["first", "again"] and again.result is not None
        assert [x.client_id for x in edge.board.results()] == [0]
    else:
        assert detail_of(r, 409) == f"stale result: task {task_id(0)!r} is not open for client 0"
        assert edge.board.results() == []


# =================================================================================================
# Settings
# =================================================================================================
async def test_torch_threads_is_a_setting_applied_at_start(monkeypatch) -> None:
    assert EdgeSettings.model_fields["torch_threads"].default == CloudSettings.model_fields["torch_threads"].default
    monkeypatch.setenv("FL_EDGE_TORCH_THREADS", "3")
    assert EdgeSettings().torch_threads == 3
    previous = torch.get_num_threads()
    try:
        async with running_edge(torch_threads=2):
            assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(previous)


# =================================================================================================
# Registration of clients that are not the edge's own
# =================================================================================================
TWO_EDGES = RunConfig.model_validate({**FAST.model_dump(), "data": {**FAST.data.model_dump(), "num_clients": 6},
                                      "topology": {**FAST.topology.model_dump(), "num_edges": 2, "buffer_size": 2}})


async def test_once_the_run_is_known_only_the_edges_own_clients_may_register() -> None:
    cloud = CloudDouble(TWO_EDGES)
    cloud.publishing = False  # no run yet
    async with running_edge(cloud_transport=cloud.transport(), edge_id=1, state_dir=None) as edge:
        await edge.register(0)  # any client while no run is known, as before
        await edge.register(2)
        cloud.publishing = True
        await until(lambda: edge.app.state.round_loop.current is not None, what="the edge learns the run")
        before = await edge.snapshot()
        rule = "edge 1 serves the clients k < 6 with k mod 2 = 1"
        for k in (2, 9, 8, 4):  # another edge's (registered before or not), beyond num_clients, both
            r = await edge.http.post("/api/v1/clients", json={"client_id": k, "num_samples": 3}, headers=auth())
            assert detail_of(r, 409) == f"client {k} is not a client of edge 1 in run {RUN_ID}: {rule}"
            assert await edge.snapshot() == before
        await edge.register(5)  # its own
        assert sorted(edge.board.clients) == [5]  # 0 and 2, registered while no run was known, are forgotten


async def test_a_round_nobody_can_answer_is_abandoned_when_the_cloud_moves_on(caplog) -> None:
    """Every client fails (say, on a diverged model): past its retries the edge waits for a first answer,
    but not for good: once the cloud offers another run, the round is dropped and the new one served. With no
    retries, the log announces none."""
    hopeless = RunConfig.model_validate({**FAST.model_dump(), "policy": {"deadline_s": 0.2, "max_retries": 0}})
    cloud = CloudDouble(hopeless)
    async with running_edge(cloud_transport=cloud.transport(), state_dir=None) as edge:
        loop = edge.app.state.round_loop
        await until(lambda: loop.current is not None, what="the edge starts the round")
        await asyncio.sleep(0.6)  # past the deadline, waiting for a first answer
        assert cloud.contributions == [] and loop.current.run_id == RUN_ID
        assert not [r.message for r in caplog.records if "again" in r.message or "re-running" in r.message]
        cloud.config, cloud.run_id = FAST, "the-next-run"
        await until(lambda: loop.current.run_id == "the-next-run", what="the edge serves the next run")
        clients = asyncio.create_task(answer_tasks(edge, range(FAST.data.num_clients)))
        try:
            await until(lambda: cloud.contributions, what="the next run's round is submitted")
        finally:
            clients.cancel()
    assert [c.run_id for c in cloud.contributions] == ["the-next-run"]


async def test_a_round_short_of_its_quorum_is_dropped_when_its_run_is_replaced() -> None:
    """Its clients 1..3 are gone (say, their process was killed) and the run was stopped for another:
    the edge must not wait out its retries (20 × 0.3 s here; 4 × 120 s by default) before serving it."""
    short = RunConfig.model_validate({**FAST.model_dump(),
                                      "policy": {"deadline_s": 0.3, "max_retries": 20, "min_fraction": 1.0}})
    cloud = CloudDouble(short)
    async with running_edge(cloud_transport=cloud.transport(), state_dir=None) as edge:
        loop = edge.app.state.round_loop
        only_client_0 = asyncio.create_task(answer_tasks(edge, [0]))
        try:
            await until(lambda: loop.current is not None and edge.board.results(), what="client 0 answers")
            cloud.config, cloud.run_id = FAST, "the-next-run"
            started = time.monotonic()
            await until(lambda: loop.current.run_id == "the-next-run", timeout=3.0, what="the next run is served")
            assert time.monotonic() - started < 3.0
        finally:
            only_client_0.cancel()
    assert cloud.contributions == []  # the replaced run's round was not submitted
