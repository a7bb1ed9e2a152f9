"""A client that cannot train its task (e.g. it lacks the run's model package) says so: the edge stops
waiting for it, and its contribution (so the round's history) lists the failure and its reason."""
from __future__ import annotations

import asyncio
import time

import anyio
import pytest

from fl_services.shared.core.reports import EdgeContributionHeader
from fl_services.shared.core.tensors import encode
from fl_services.shared.wire.client_edge import ClientResultHeader, ClientTaskHeader
from tests.edge.harness import (
    CONFIG,
    RUN_ID,
    CloudDouble,
    answer_tasks,
    auth,
    result_header,
    running_edge,
    serve_tasks,
    task_id,
    task_tensors,
    until,
    zeros_like,
)
from tests.web import detail_of

pytestmark = pytest.mark.anyio

ERROR = "UserCodeError: cannot import the model factory 'pkg.models:net': No module named 'pkg'"


async def fail_tasks(edge, client_ids) -> None:
    """Clients that register, then report every task they fetch as failed (until cancelled)."""
    async def report(k: int, _, header: ClientTaskHeader) -> None:
        r = await edge.http.post(f"/api/v1/clients/{k}/failures", headers=auth(),
                                 json={"task_id": header.task_id, "client_id": k, "error": ERROR})
        assert r.status_code in (202, 409), r.text
        await asyncio.sleep(0.5)  # the task stays open until the round ends: do not spin

    await serve_tasks(edge, client_ids, report)


async def test_reported_failures_end_the_wait_and_reach_the_contribution() -> None:
    # Without the reports the edge would wait the whole minute for clients 2 and 3.
    config = CONFIG.model_copy(update={"policy": CONFIG.policy.model_copy(
        update={"deadline_s": 60.0, "min_fraction": 0.5, "max_retries": 0})})
    cloud = CloudDouble(config)
    started = time.monotonic()
    async with running_edge(cloud_transport=cloud.transport()) as edge:
        clients = [asyncio.create_task(answer_tasks(edge, [0, 1])), asyncio.create_task(fail_tasks(edge, [2, 3]))]
        try:
            await until(lambda: cloud.contributions, timeout=30, what="the round is submitted")
        finally:
            for c in clients:
                c.cancel()
    assert time.monotonic() - started < 30
    contribution = cloud.contributions[0]
    assert [p.client_id for p in contribution.clients] == [0, 1]
    assert [(f.client_id, f.error) for f in contribution.failures] == [(2, ERROR), (3, ERROR)]


async def hold_tasks(edge, client_ids) -> None:
    """Clients that register and keep polling, but answer no task they fetch (until cancelled)."""
    async def hold(*_) -> None:
        await asyncio.sleep(0.2)

    await serve_tasks(edge, client_ids, hold)


async def leave_with_task(edge, client_id: int) -> None:
    """A client that registers, fetches its task and is heard from no more."""
    await edge.register(client_id)
    with anyio.fail_after(30):
        while await edge.open_task(client_id) is None:
            await asyncio.sleep(0.05)


async def test_a_device_gone_offline_mid_round_ends_the_wait_for_it_and_is_named_offline() -> None:
    """It had its task when the round started; once silent for the offline window (2 × 0.1 + 5 s here) the round
    stops waiting for it, at every retry too: not ten minutes, four times."""
    config = CONFIG.model_copy(update={"policy": CONFIG.policy.model_copy(
        update={"deadline_s": 600.0, "min_fraction": 1.0, "max_retries": 3})})
    cloud = CloudDouble(config)
    async with running_edge(cloud_transport=cloud.transport(), long_poll_max_s=0.1) as edge:
        answering = asyncio.create_task(answer_tasks(edge, [0, 1, 2]))
        try:
            await leave_with_task(edge, 3)
            await until(lambda: cloud.contributions, timeout=60, what="the round is submitted")
        finally:
            answering.cancel()
    contribution = cloud.contributions[0]
    assert [p.client_id for p in contribution.clients] == [0, 1, 2]
    [failure] = contribution.failures
    assert (failure.client_id, failure.kind) == (3, "offline")
    assert failure.error == "offline: not heard from for over 5.2 s while its task was open"


async def test_a_device_whose_upload_fails_after_its_offline_moment_is_not_waited_for_until_the_deadline() -> None:
    """Uploading, a device is heard; once its upload fails (its body timed out, 408) past the moment it would have
    gone offline, the round waiting for it stops waiting then: nothing announces that moment."""
    async with running_edge() as edge:
        await edge.open_tasks(0)
        edge.board.offline_after_s = 0.3
        waiting = asyncio.create_task(edge.board.wait_results(RUN_ID, timeout=600))
        with edge.board.receiving(0):
            await asyncio.sleep(0.5)
            assert not edge.board.offline(0, time.time()) and not waiting.done()
        with anyio.fail_after(10):
            assert await waiting == []
        assert [(f.client_id, f.kind) for f in edge.board.unanswered(RUN_ID, 0, "600 s")] == [(0, "offline")]


async def first_contribution(policy: dict, answering: list[int], holding: list[int]) -> EdgeContributionHeader:
    """The contribution of a round where the clients `answering` answer and those `holding` poll but never do."""
    cloud = CloudDouble(CONFIG.model_copy(update={"policy": CONFIG.policy.model_copy(update=policy)}))
    async with running_edge(cloud_transport=cloud.transport()) as edge:
        clients = [asyncio.create_task(answer_tasks(edge, answering)), asyncio.create_task(hold_tasks(edge, holding))]
        try:
            await until(lambda: cloud.contributions, timeout=30, what="the round is submitted")
        finally:
            for c in clients:
                c.cancel()
    return cloud.contributions[0]


async def test_a_device_heard_from_but_not_answering_by_the_deadline_is_named_timed_out() -> None:
    contribution = await first_contribution({"deadline_s": 1.0, "min_fraction": 0.5, "max_retries": 0}, [0, 1, 2], [3])
    assert [p.client_id for p in contribution.clients] == [0, 1, 2]
    assert [(f.client_id, f.kind, f.error) for f in contribution.failures] == [
        (3, "timeout", "no answer by the round's deadline (1 s)")]


async def test_a_round_closed_by_enough_answers_names_no_device_that_did_not_answer() -> None:
    """policy.answers = 3: the fourth task is withdrawn when the third answer comes, which is no failure."""
    contribution = await first_contribution({"deadline_s": 600.0, "answers": 3, "max_retries": 0}, [0, 1, 2], [3])
    assert [p.client_id for p in contribution.clients] == [0, 1, 2] and contribution.failures == []


async def test_a_failure_report_is_checked_like_a_result() -> None:
    async with running_edge() as edge:
        await edge.open_tasks(0, 1)
        report = {"task_id": task_id(0), "client_id": 0, "error": ERROR}
        detail_of(await edge.http.post("/api/v1/clients/1/failures", json=report, headers=auth()), 422,
                  "does not match")
        stale = {**report, "task_id": "another-task"}
        detail_of(await edge.http.post("/api/v1/clients/0/failures", json=stale, headers=auth()), 409, "stale")
        detail_of(await edge.http.post("/api/v1/clients/0/failures", json={**report, "error": ""}, headers=auth()),
                  422)
        r = await edge.http.post("/api/v1/clients/0/failures", json=report, headers=auth("wrong-token"))
        assert r.status_code == 401
        assert edge.board.failures() == []
        r = await edge.http.post("/api/v1/clients/0/failures", json=report, headers=auth())
        assert r.status_code == 202, r.text
        assert [(f.client_id, f.error) for f in edge.board.failures()] == [(0, ERROR)]
        # Reported again (a retry, or another reason): the first reason stays, and the answer says it was not taken.
        r = await edge.http.post("/api/v1/clients/0/failures", json={**report, "error": "OSError: later"},
                                 headers=auth())
        assert (r.status_code, r.json()) == (200, {"accepted": False})
        assert [(f.client_id, f.error) for f in edge.board.failures()] == [(0, ERROR)]
        # The client process restarted with what it lacked: its result still answers the task.
        header: ClientResultHeader = result_header(0)
        r = await edge.send_result(0, encode(zeros_like(task_tensors(0)), header))
        assert r.status_code == 202, r.text
        assert edge.board.failures() == [] and [r.client_id for r in edge.board.results()] == [0]
        detail_of(await edge.http.post("/api/v1/clients/0/failures", json=report, headers=auth()), 409, "duplicate")
