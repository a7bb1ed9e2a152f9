"""A client process's result bundle (POST /api/v1/clients/results): many logical clients' results in one upload,
each taken or refused on its own with the status and reason the per-client route gives it, sent with the edge's
client secret only."""
from __future__ import annotations

import asyncio
import math

import pytest
import torch

from fl_services.shared.core.edge_round import device_seconds
from fl_services.shared.core.tensors import Tensors, encode
from fl_services.shared.wire import bundle
from fl_services.shared.wire.client_edge import ClientResultHeader, ClientTaskHeader, ResultBatchReceipt
from fl_services.shared.wire.protocol import RESULT_BUNDLE, client_token
from tests.edge.harness import (
    CLIENT_TOKEN,
    CONFIG,
    CloudDouble,
    Edge,
    auth,
    result,
    result_header,
    running_edge,
    serve_tasks,
    task_id,
    task_tensors,
    true_samples,
    until,
    zeros_like,
)

pytestmark = pytest.mark.anyio


async def send(edge: Edge, items: list[tuple[int, str, bytes]], token: str = CLIENT_TOKEN):
    body = bundle.pack([(k, t, blob, b"") for k, t, blob in items])
    return await edge.http.post("/api/v1/clients/results", content=body,
                                headers={**auth(token), "Content-Type": RESULT_BUNDLE})


def outcomes(response) -> list[tuple[int, str, int]]:
    assert response.status_code == 200, response.text
    receipt = ResultBatchReceipt.model_validate_json(response.content)
    return [(o.client_id, o.task_id, o.status) for o in receipt.results]


def refused_total(edge: Edge, reason: str) -> float:
    return edge.app.state.metrics.refused.labels(reason)._value.get()


async def test_a_bundle_answers_each_of_its_clients_tasks_once(edge: Edge) -> None:
    await edge.open_tasks(0, 1, 2)
    items = [(k, task_id(k), result(k)) for k in (0, 1, 2)]
    assert outcomes(await send(edge, items)) == [(k, task_id(k), 202) for k in (0, 1, 2)]
    assert sorted(r.client_id for r in edge.board.results()) == [0, 1, 2]
    assert edge.app.state.metrics.results._value.get() == 3
    # Sent again (a retry through a passing fault): each is a duplicate, as on the per-client route, and counts once.
    assert outcomes(await send(edge, items)) == [(k, task_id(k), 409) for k in (0, 1, 2)]
    assert len(edge.board.results()) == 3 and refused_total(edge, "duplicate") == 3
    single = await edge.send_result(0, result(0))
    assert single.status_code == 409


async def test_a_bad_result_is_refused_with_its_reason_and_the_good_ones_accepted(edge: Edge) -> None:
    await edge.open_tasks(0, 1, 2, 3)
    nan = zeros_like(task_tensors(2))
    next(iter(nan.values())).view(-1)[0] = math.nan
    items = [
        (0, task_id(0), result(0)),                                       # good
        (1, task_id(1), b"not a safetensors document"),                   # unreadable: 400
        (2, task_id(2), encode(nan, result_header(2))),                   # NaN: 422
        (3, "another-task", result(3, task_id="another-task")),           # not its open task: 409 stale
        (9, task_id(9), result(9)),                                       # never registered: 404
        (3, task_id(3), result(0)),                                       # named as client 3, client 0's result: 422
    ]
    response = await send(edge, items)
    got = ResultBatchReceipt.model_validate_json(response.content).results
    assert [(o.client_id, o.task_id, o.status) for o in got] == [
        (0, task_id(0), 202), (1, task_id(1), 400), (2, task_id(2), 422), (3, "another-task", 409),
        (9, task_id(9), 404), (3, task_id(3), 422)]
    details = [o.detail or "" for o in got]
    assert got[0].detail is None
    assert "NaN" in details[2] and "stale" in details[3] and "register" in details[4] and "client 0" in details[5]
    assert [r.client_id for r in edge.board.results()] == [0]
    for k in (1, 2, 3):  # nothing of theirs changed: each still answers its task on its own
        assert (await edge.send_result(k, result(k))).status_code == 202


async def test_the_same_result_twice_in_one_bundle_counts_once(edge: Edge) -> None:
    await edge.open_tasks(0)
    assert [s for *_, s in outcomes(await send(edge, [(0, task_id(0), result(0))] * 2))] == [202, 409]
    assert len(edge.board.results()) == 1


async def test_a_bundle_is_the_secrets_to_send(edge: Edge) -> None:
    await edge.open_tasks(0)
    r = await send(edge, [(0, task_id(0), result(0))], token=client_token(CLIENT_TOKEN, 0))
    assert r.status_code == 401 and "client secret" in r.json()["detail"]
    assert (await send(edge, [(0, task_id(0), result(0))], token="wrong")).status_code == 401
    assert edge.board.results() == []


@pytest.mark.parametrize("body", [b"", b"\x05\x00\x00\x00\x00\x00\x00\x00{}", bundle.pack([])])
async def test_a_body_that_is_no_bundle_of_results_is_400(edge: Edge, body: bytes) -> None:
    r = await edge.http.post("/api/v1/clients/results", content=body,
                             headers={**auth(), "Content-Type": RESULT_BUNDLE})
    assert r.status_code == 400, r.text
    assert refused_total(edge, "unreadable") == 1


async def test_the_results_taken_from_a_bundle_are_those_the_per_client_route_takes(edge: Edge) -> None:
    await edge.open_tasks(0, 1)
    ones = {k: torch.full_like(v, 0.25) for k, v in task_tensors(0).items()}
    assert outcomes(await send(edge, [(0, task_id(0), encode(ones, result_header(0)))]))[0][2] == 202
    assert (await edge.send_result(1, encode(ones, result_header(1)))).status_code == 202
    by_client = {r.client_id: r for r in edge.board.results()}
    assert by_client[0].num_samples == by_client[1].num_samples and by_client[0].loss == by_client[1].loss
    assert all(torch.equal(by_client[0].tensors[g][n], by_client[1].tensors[g][n])
               for g in by_client[0].tensors for n in by_client[0].tensors[g])


async def test_answers_past_k_that_come_together_close_the_round_with_the_k_the_reference_takes() -> None:
    """policy.answers = 1 and two answers in one bundle: the round closes with one, as the reference runner
    (shared/core/edge_round.py, first_answers) takes it: least modelled time, ties to the lower id. Sent first
    in the bundle, client 1 is the one it does not take."""
    config = CONFIG.model_copy(update={"policy": CONFIG.policy.model_copy(
        update={"deadline_s": 600.0, "answers": 1, "max_retries": 0})})
    cloud = CloudDouble(config)
    fetched: dict[int, tuple[Tensors, ClientTaskHeader]] = {}

    async def keep(k: int, tensors: Tensors, header: ClientTaskHeader) -> None:
        fetched[k] = (tensors, header)
        await asyncio.sleep(0.2)

    async with running_edge(cloud_transport=cloud.transport()) as edge:
        holding = asyncio.create_task(serve_tasks(edge, range(4), keep))
        try:
            await until(lambda: len(fetched) == 4, timeout=30, what="every task fetched")
            items = [(k, header.task_id, encode(zeros_like(tensors), ClientResultHeader(
                task_id=header.task_id, client_id=k, num_samples=true_samples(config, k), loss=0.5)))
                for k, (tensors, header) in ((1, fetched[1]), (2, fetched[2]))]
            assert [status for *_, status in outcomes(await send(edge, items))] == [202, 202]
            await until(lambda: cloud.contributions, timeout=30, what="the round is submitted")
        finally:
            holding.cancel()
    # Client 2's partition is the smaller here: its modelled time is the least.
    assert device_seconds(config, 2, true_samples(config, 2)) < device_seconds(config, 1, true_samples(config, 1))
    assert [p.client_id for p in cloud.contributions[0].clients] == [2]
