"""The batch long-poll of a client process (POST /api/v1/clients/tasks): every open task of its clients in
one bundle, the tasks it holds left out, unknown clients named, each id's token or the secret, and a wait
woken by a post for one of its clients only."""
from __future__ import annotations

import asyncio
import struct
import time
from typing import Any

import anyio
import pytest
import torch

from fl_services.edge.tasks import TaskBoard
from fl_services.shared.core.records import decode, encode, flatten
from fl_services.shared.core.tensors import SharedEncoding
from fl_services.shared.wire import bundle
from fl_services.shared.wire.client_edge import ClientRegistration, ClientTaskHeader, TaskPoll
from fl_services.shared.wire.protocol import (
    LIVE_RUNS,
    REFUSED_CLIENTS,
    TASK_BUNDLE,
    UNKNOWN_CLIENTS,
    client_token,
    issue_device_tokens,
)
from tests.edge.harness import CLIENT_TOKEN, RUN_ID, CloudDouble, Edge, auth, running_edge, task_id, task_record
from tests.edge.test_runs import task

pytestmark = pytest.mark.anyio


async def poll(edge: Edge, token: str = CLIENT_TOKEN, **body: Any):
    return await edge.http.post("/api/v1/clients/tasks", json={"timeout": 0, **body}, headers=auth(token))


async def test_one_poll_brings_every_open_task_of_its_clients_but_those_held(edge: Edge) -> None:
    await edge.open_tasks(0, 1, 2)
    r = await poll(edge, client_ids=[0, 1, 2])
    assert r.status_code == 200 and r.headers["content-type"] == TASK_BUNDLE
    items = bundle.unpack(r.content)
    assert [(i.client_id, i.task_id) for i in items] == [(k, task_id(k)) for k in (0, 1, 2)]
    for item in items:  # each item is the task message the per-client route sends, byte for byte
        tensors, header = decode(item.message(), ClientTaskHeader)
        assert header.client_id == item.client_id and tensors.keys() == task_record(item.client_id).keys()
        single = await edge.http.get(f"/api/v1/clients/{item.client_id}/task", params={"timeout": 0}, headers=auth())
        assert single.content == item.message()
    r = await poll(edge, client_ids=[0, 1, 2], holding=[task_id(0), task_id(2)])
    assert [i.client_id for i in bundle.unpack(r.content)] == [1]
    r = await poll(edge, client_ids=[0, 1, 2], holding=[task_id(k) for k in (0, 1, 2)])
    assert r.status_code == 204 and UNKNOWN_CLIENTS not in r.headers


async def test_unknown_clients_are_named_and_the_others_served_at_once(edge: Edge) -> None:
    await edge.open_tasks(0)
    started = time.monotonic()
    r = await poll(edge, client_ids=[0, 5, 7], timeout=30)
    assert r.status_code == 200 and r.headers[UNKNOWN_CLIENTS] == "5,7"
    r = await poll(edge, client_ids=[5], timeout=30)  # nothing to wait for until it registers
    assert r.status_code == 204 and r.headers[UNKNOWN_CLIENTS] == "5"
    assert time.monotonic() - started < 5


async def test_a_device_token_polls_for_its_own_client_only(edge: Edge) -> None:
    await edge.open_tasks(0, 1)
    own = client_token(CLIENT_TOKEN, 0)
    assert (await poll(edge, own, client_ids=[0])).status_code == 200
    r = await poll(edge, own, client_ids=[0, 1])  # client 1 is left out, and named
    assert r.status_code == 200 and r.headers[REFUSED_CLIENTS] == "1"
    assert [i.client_id for i in bundle.unpack(r.content)] == [0]
    assert (await poll(edge, own, client_ids=[1])).status_code == 401
    assert (await poll(edge, "wrong", client_ids=[0])).status_code == 401
    assert (await poll(edge, own, client_ids="0")).status_code == 401  # not a list: only the secret gets a 422


@pytest.mark.parametrize("body", [{"client_ids": []}, {"client_ids": [-1]}, {"client_ids": [0], "timeout": -1},
                                  {"client_ids": [0], "holding": [""]}, {"client_ids": [0], "surplus": 1}])
async def test_bad_polls_are_422(edge: Edge, body: dict[str, Any]) -> None:
    r = await edge.http.post("/api/v1/clients/tasks", json=body, headers=auth())
    assert r.status_code == 422, r.text


async def test_an_oversized_poll_is_413(edge: Edge) -> None:
    r = await edge.http.post("/api/v1/clients/tasks", content=b"[" + b"0," * TaskPoll.max_body_bytes + b"0]",
                             headers={**auth(), "Content-Type": "application/json"})
    assert r.status_code == 413


async def test_a_post_wakes_the_polls_of_its_clients_only() -> None:
    board = TaskBoard()
    for k in range(3):
        board.register(ClientRegistration(client_id=k))
    mine = asyncio.create_task(board.fetch_many([0, 1], set(), timeout=30))
    other = asyncio.create_task(board.fetch_many([2], set(), timeout=30))
    await asyncio.sleep(0.05)
    await board.post([task("run", 1)])
    assert [t.header.client_id for t in await asyncio.wait_for(mine, 1)] == [1]
    await asyncio.sleep(0.05)
    assert not other.done()
    await board.close()
    assert await asyncio.wait_for(other, 1) == []


async def test_a_held_task_posted_again_during_the_poll_is_handed_out_at_once() -> None:
    """A failed round runs again with the same task ids: a poll that began while the process held them (it named
    them in `holding`) gets them at the post, not a long-poll later; one begun after the post leaves them out."""
    board = TaskBoard()
    board.register(ClientRegistration(client_id=0))
    await board.post([task("run", 0)])
    held = {task("run", 0).header.task_id}
    assert await board.fetch_many([0], held, timeout=0) == []
    waiting = asyncio.create_task(board.fetch_many([0], held, timeout=30))
    await asyncio.sleep(0.05)
    assert not waiting.done()
    await board.post([task("run", 0)])  # the round run again
    assert [t.header.task_id for t in await asyncio.wait_for(waiting, 10)] == list(held)
    assert await board.fetch_many([0], held, timeout=0) == []


async def test_a_round_encodes_the_tensors_its_tasks_share_once() -> None:
    """Every task of a round that sends the same tensors (FedAvg's global state) shares one encoding."""
    board = TaskBoard()
    shared_state = task_record(0)
    tasks = [task("run", k) for k in range(3)]
    for t in tasks:
        t.tensors = shared_state
    await board.post(tasks)
    assert tasks[0].encoding is tasks[1].encoding is tasks[2].encoding
    for t in tasks:
        tensors, header = decode(t.blob(), ClientTaskHeader)
        assert header == t.header
        assert all(v.equal(flatten(shared_state)[k]) for k, v in flatten(tensors).items())


def test_a_shared_encoding_reads_back_as_encode_writes() -> None:
    tensors = {"a/w": torch.arange(6.0).reshape(2, 3), "a/b": torch.tensor([1], dtype=torch.int64),
               "b/x": torch.zeros(0)}
    header = task("run", 0).header
    ours = SharedEncoding(tensors).blob(header)
    theirs = encode({"a": {"w": tensors["a/w"], "b": tensors["a/b"]}, "b": {"x": tensors["b/x"]}}, header)
    assert struct.unpack("<Q", ours[:8])[0] % 8 == 0  # the data starts 8-aligned, as safetensors writes it
    (ours_t, ours_h), (theirs_t, theirs_h) = decode(ours, ClientTaskHeader), decode(theirs, ClientTaskHeader)
    assert ours_h == theirs_h and flatten(ours_t).keys() == flatten(theirs_t).keys()
    mine = flatten(ours_t)
    assert all(mine[k].equal(v) and mine[k].dtype == v.dtype for k, v in flatten(theirs_t).items())


def test_a_shared_encoding_of_no_tensors_reads_back() -> None:
    header = task("run", 0).header
    tensors, message = decode(SharedEncoding({}).blob(header), ClientTaskHeader)
    assert tensors == {} and message == header


async def test_each_client_may_bring_its_own_token_and_a_revoked_one_is_left_out(edge: Edge) -> None:
    """A process holding one token per client (client_tokens) and no secret polls for all of them at once."""
    await edge.open_tasks(0, 1, 2)
    tokens = issue_device_tokens(CLIENT_TOKEN, [0, 1, 2])
    body = {"client_ids": [0, 1, 2], "tokens": {str(k): t for k, t in tokens.items()}}
    r = await poll(edge, tokens[0], **body)
    assert r.status_code == 200 and REFUSED_CLIENTS not in r.headers
    assert [i.client_id for i in bundle.unpack(r.content)] == [0, 1, 2]
    edge.app.state.revocations.ids = frozenset({tokens[1].split(".")[2]})
    r = await poll(edge, tokens[0], **body)
    assert r.headers[REFUSED_CLIENTS] == "1" and [i.client_id for i in bundle.unpack(r.content)] == [0, 2]
    swapped = {**body, "tokens": {"0": tokens[2], "2": tokens[0]}}  # another client's token is no token
    assert (await poll(edge, "not-a-token", **swapped)).status_code == 401


async def test_the_answer_names_the_live_runs_once_the_cloud_has_named_them() -> None:
    """The client deletes its clients' state of the runs not named (client/state.drop_ended_runs): an edge
    that has not heard from the cloud names none, rather than an empty list that would delete everything."""
    async with running_edge() as edge:  # no cloud to hear from
        await edge.register(0)
        assert LIVE_RUNS not in (await poll(edge, client_ids=[0])).headers
    cloud = CloudDouble()
    async with running_edge(cloud.transport()) as edge:
        await edge.register(0)
        loop = edge.app.state.round_loop
        with anyio.fail_after(10):
            while loop.live_runs is None:
                await asyncio.sleep(0.01)
        assert (await poll(edge, client_ids=[0])).headers[LIVE_RUNS] == RUN_ID
        cloud.publishing = False  # the run ended
        with anyio.fail_after(10):
            while loop.live_runs:
                await asyncio.sleep(0.01)
        assert (await poll(edge, client_ids=[0])).headers[LIVE_RUNS] == ""
