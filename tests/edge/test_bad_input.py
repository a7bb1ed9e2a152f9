"""Bad input at every edge (client-facing) endpoint: the exact 4xx code, a clear `detail`, no change of state.

The edge runs in-process (httpx.ASGITransport, lifespan entered by hand). Its round loop dials a cloud
at an unused port and just keeps retrying in the background; open tasks are put on the board directly
with `TaskBoard.post`, exactly as the round loop would after fetching a global state.
"""
from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Awaitable
from functools import partial
from typing import Any

import httpx
import pytest
import torch

from fl_services.shared.core.reports import HeldOut
from fl_services.shared.core.tensors import Tensors, encode
from fl_services.shared.wire.client_edge import ClientRegistration, TaskPoll
from fl_services.shared.wire.protocol import SAFETENSORS, client_token, device_token
from tests.edge.harness import (
    ACCEPTED,
    CLIENT_TOKEN,
    EDGE_TOKEN,
    RUN_ID,
    Edge,
    auth,
    result,
    result_header,
    running_edge,
    task_id,
    task_tensors,
    zeros_like,
)
from tests.web import OVERSIZED, assert_refuses_oversized, detail_of, not_safetensors, raw_message

pytestmark = pytest.mark.anyio

ENDPOINTS = [("POST", "/api/v1/clients"), ("GET", "/api/v1/clients/0/task"), ("POST", "/api/v1/clients/0/results")]


OWN_ROUTES = {  # what client k does with its own token, by route
    "register": lambda k: ("POST", "/api/v1/clients", {"json": {"client_id": k}}),
    "task": lambda k: ("GET", f"/api/v1/clients/{k}/task", {"params": {"timeout": 0}}),
    "result": lambda k: ("POST", f"/api/v1/clients/{k}/results",
                         {"content": result(k), "headers": {"Content-Type": SAFETENSORS}}),
}


@pytest.mark.parametrize("path", ["/api/v1/clients/¹/task", "/api/v1/clients/①/task", "/api/v1/clients/" + "0" * 5001
                                  + "1/task"], ids=["superscript", "circled", "5002-digits"])
async def test_odd_client_ids_with_a_bogus_token_are_401(edge: Edge, path: str) -> None:
    """str.isdigit() admits '¹' and '①', which int() refuses: a 500 once."""
    r = await edge.http.get(path, params={"timeout": 0}, headers=auth("bogus"))
    assert detail_of(r, 401) == "invalid bearer token"
    r = await edge.http.get(path, params={"timeout": 0}, headers=auth())  # the secret: the id is the matter
    assert r.status_code in (404, 422), r.text  # 0…01 is client 1, unknown here


@pytest.mark.parametrize("body", [b'{"client_id": "zero"}', b"{not json", b"[1]", b'{"client_id": 1, "x": 1}',
                                  b"[" * 5000 + b"]" * 5000], ids=["string-id", "not-json", "array", "extra", "nested"])
async def test_registration_checks_the_token_before_the_body(edge: Edge, body: bytes) -> None:
    before = await edge.snapshot()
    r = await edge.http.post("/api/v1/clients", content=body,
                             headers={**auth("bogus"), "Content-Type": "application/json"})
    assert detail_of(r, 401) == "invalid bearer token"
    assert await edge.snapshot() == before


CLAIMING_ROUTES = {"register": ("/api/v1/clients", ClientRegistration.max_body_bytes),
                   "poll": ("/api/v1/clients/tasks", TaskPoll.max_body_bytes)}


@pytest.mark.parametrize("route", CLAIMING_ROUTES)
async def test_a_wrong_token_with_an_oversized_body_is_401_before_413(edge: Edge, route: str) -> None:
    """These routes read the body to learn which client a device token claims to be; a body past their limit claims
    none, and the caller is refused as a caller first. A device token that names its client (issued) is genuine
    without the body: it is told the body is too large."""
    path, limit = CLAIMING_ROUTES[route]
    blob = b'{"client_id": 1, "client_ids": [1], "pad": "' + b"a" * limit + b'"}'
    before = await edge.snapshot()
    for token in ("bogus", client_token("another secret", 1), device_token("another secret", 1, "aaaabbbbcccc")):
        r = await edge.http.post(path, content=blob, headers={**auth(token), "Content-Type": "application/json"})
        assert detail_of(r, 401) == "invalid bearer token"
    r = await edge.http.post(path, content=blob, headers={**auth(device_token(CLIENT_TOKEN, 1, "aaaabbbbcccc")),
                                                          "Content-Type": "application/json"})
    assert detail_of(r, 413) == f"payload of {len(blob)} bytes exceeds the limit of {limit}"
    assert await edge.snapshot() == before


async def test_a_batch_polls_own_bearer_must_be_a_credential_whatever_the_inner_tokens(edge: Edge) -> None:
    """The per-client tokens of a poll say which of its clients are served; the bearer itself must be a
    credential (the secret, or one of the polled clients' tokens): without one the poll is 401, wrong or absent."""
    await edge.open_tasks(1, 2)
    body = {"client_ids": [1, 2], "timeout": 0, "tokens": {"1": client_token(CLIENT_TOKEN, 1),
                                                            "2": client_token(CLIENT_TOKEN, 2)}}
    for headers in (auth("bogus"), auth(client_token(CLIENT_TOKEN, 3)), {}):
        r = await edge.http.post("/api/v1/clients/tasks", json=body, headers=headers)
        assert r.status_code == 401, (headers, r.text)
    for token in (client_token(CLIENT_TOKEN, 1), client_token(CLIENT_TOKEN, 2), CLIENT_TOKEN):
        r = await edge.http.post("/api/v1/clients/tasks", json=body, headers=auth(token))
        assert r.status_code == 200, r.text


@pytest.mark.parametrize("body", [{"client_id": False}, {"client_id": 1, "num_samples": False},
                                  {"client_id": 1, "num_samples": "3"}, {"client_id": 1.0}],
                         ids=["false-id", "false-samples", "string-samples", "float-id"])
async def test_registration_integers_take_no_boolean_string_or_float(edge: Edge, body: dict[str, Any]) -> None:
    before = await edge.snapshot()
    r = await edge.http.post("/api/v1/clients", json=body, headers=auth())
    detail = detail_of(r, 422, "valid integer")
    assert all(e["loc"][:2] in (["body", "client_id"], ["body", "num_samples"]) for e in detail), detail
    assert await edge.snapshot() == before


@pytest.mark.parametrize("route", OWN_ROUTES)
async def test_a_clients_own_token_acts_for_it_alone(edge: Edge, route: str) -> None:
    """A device holds client_token(secret, k), not the edge's secret: it may answer its own tasks, and
    not those of the client next door (whose task ids are easy to guess)."""
    await edge.open_tasks(0, 1)
    before = await edge.snapshot(0, 1)
    method, path, kwargs = OWN_ROUTES[route](1)
    headers = {**auth(client_token(CLIENT_TOKEN, 0)), **kwargs.pop("headers", {})}
    r = await edge.http.request(method, path, headers=headers, **kwargs)
    assert detail_of(r, 401) == "invalid bearer token"
    assert await edge.snapshot(0, 1) == before

    method, path, kwargs = OWN_ROUTES[route](0)
    headers = {**auth(client_token(CLIENT_TOKEN, 0)), **kwargs.pop("headers", {})}
    r = await edge.http.request(method, path, headers=headers, **kwargs)
    assert r.status_code in (200, 202), r.text


@pytest.mark.parametrize(
    ("token", "expected"),
    [(None, "missing bearer token"), ("not-the-client-token", "invalid bearer token"),
     (EDGE_TOKEN, "invalid bearer token")],
    ids=["missing-token", "wrong-token", "edge-token"],
)
@pytest.mark.parametrize(("method", "path"), ENDPOINTS, ids=[f"{m} {p[7:]}" for m, p in ENDPOINTS])
async def test_client_api_refuses_bad_tokens(edge: Edge, method: str, path: str, token: str | None,
                                             expected: str) -> None:
    await edge.open_tasks(0)
    before = await edge.snapshot(0)
    kwargs: dict[str, Any] = {
        "POST /api/v1/clients": {"json": {"client_id": 5, "num_samples": 3}},
        "GET /api/v1/clients/0/task": {"params": {"timeout": 0}},
        "POST /api/v1/clients/0/results": {"content": result(0), "headers": {"Content-Type": SAFETENSORS}},
    }[f"{method} {path}"]
    headers = {**auth(token), **kwargs.pop("headers", {})}
    r = await edge.http.request(method, path, headers=headers, **kwargs)
    assert detail_of(r, 401) == expected
    assert r.headers["www-authenticate"] == "Bearer"
    assert await edge.snapshot(0) == before
    assert before["open"] == {0: task_id(0)}


# =================================================================================================
# Register
# =================================================================================================
@pytest.mark.parametrize(
    ("body", "fragment"),
    [({}, "missing"), ({"client_id": -1}, "greater than or equal to 0"),
     ({"client_id": 2**31}, "less than or equal"), ({"client_id": "zero"}, "valid integer"),
     ({"client_id": 1, "num_samples": -3}, "num_samples"), ({"client_id": 1, "token": "x"}, "Extra inputs"),
     ({"client_id": 1, "capabilities": {"gpu": {"model": "x"}}}, "capabilities"),
     ({"client_id": 1, "capabilities": {f"k{i}": i for i in range(65)}}, "capabilities"),
     ({"client_id": 1, "capabilities": {"note": "x" * 201}}, "at most 200 characters"),
     ({"client_id": 1, "capabilities": {"k" * 65: 1}}, "at most 64 characters"),
     (b'{"client_id": 1, "capabilities": {"speed": 1e400}}', "finite"),
     (b'{"client_id": 1, "num_samples": 1e400}', "num_samples"),
     (b'{"client_id": 1', "JSON decode error"), ([1], "valid dictionary")],
    ids=["missing-client-id", "negative", "too-large", "string", "negative-samples", "extra-key",
         "nested-capability", "too-many-capabilities", "long-capability", "long-capability-name",
         "infinite-capability", "infinite-samples", "malformed-json", "array"],
)
async def test_register_client_bad_body(edge: Edge, body: Any, fragment: str) -> None:
    await refused_with_nothing_stored(edge, body, fragment)


GOOD_SUMMARY = {"samples": 3, "held_out_samples": 0, "input_shape": [1, 8, 8], "labels": [0, 1],
                "histogram": {"0": 2, "1": 1}}


@pytest.mark.parametrize(
    ("summary", "fragment"),
    [({"samples": 10**12 + 1, "histogram": {"0": 10**12 + 1}}, "less than or equal to 1000000000000"),
     ({"held_out_samples": 10**12 + 1}, "less than or equal to 1000000000000"),
     ({"input_shape": [-1, 0, 8]}, "greater than or equal to 1"), ({"input_shape": []}, "at least 1 item"),
     ({"input_shape": [10**9, 10**9, 10**9]}, "less than or equal to 16777216"),
     ({"input_shape": [1] * 9}, "at most 8 items"),
     ({"histogram": {"-5": -3}}, "greater than or equal to 0"),
     ({"labels": [-1, 0, 1]}, "greater than or equal to 0"), ({"labels": [0, 1, 10**20]}, "less than or equal"),
     ({"labels": [1, 0]}, "ascending and distinct"), ({"labels": [0, 0, 1]}, "ascending and distinct"),
     ({"labels": [0], "histogram": {"0": 2, "1": 1}}, "that labels does not list"),
     ({"samples": 4}, "not samples=4")],
    ids=["samples", "held-out", "negative-shape", "empty-shape", "huge-shape", "long-shape", "negative-histogram",
         "negative-label", "huge-label", "descending", "repeated", "histogram-beyond-labels", "histogram-sum"],
)
async def test_register_refuses_a_summary_no_data_has(edge: Edge, summary: dict[str, Any], fragment: str) -> None:
    """A device's data summary becomes its declared membership (its count a weight): every figure is checked where
    it enters, so none stops a round later."""
    assert (await edge.http.post("/api/v1/clients", json={"client_id": 2, "summary": GOOD_SUMMARY},
                                 headers=auth())).status_code == 200
    await refused_with_nothing_stored(edge, {"client_id": 1, "summary": {**GOOD_SUMMARY, **summary}}, fragment)


async def refused_with_nothing_stored(edge: Edge, body: Any, fragment: str) -> None:
    await edge.open_tasks(0)
    before = await edge.snapshot(0)
    if isinstance(body, bytes):
        r = await edge.http.post("/api/v1/clients", content=body,
                                 headers={**auth(), "Content-Type": "application/json"})
    else:
        r = await edge.http.post("/api/v1/clients", json=body, headers=auth())
    detail = detail_of(r, 422, fragment)
    assert all(e["loc"][0] == "body" for e in detail)
    assert await edge.snapshot(0) == before
    assert 1 not in edge.board.clients


# =================================================================================================
# Task long-poll
# =================================================================================================
async def test_task_unregistered_client(edge: Edge) -> None:
    await edge.open_tasks(0)
    before = await edge.snapshot(0)
    r = await edge.http.get("/api/v1/clients/9/task", params={"timeout": 0}, headers=auth())
    assert detail_of(r, 404) == "unknown client 9; register first"
    assert await edge.snapshot(0) == before
    assert 9 not in edge.board.clients


@pytest.mark.parametrize("params", [{"timeout": -1}, {"timeout": "soon"}], ids=["negative-timeout", "not-a-number"])
async def test_task_bad_query(edge: Edge, params: dict[str, Any]) -> None:
    await edge.open_tasks(0)
    before = await edge.snapshot(0)
    r = await edge.http.get("/api/v1/clients/0/task", params=params, headers=auth())
    detail = detail_of(r, 422)
    assert [e["loc"] for e in detail] == [["query", "timeout"]]
    assert await edge.snapshot(0) == before


async def test_task_client_id_not_an_int(edge: Edge) -> None:
    await edge.open_tasks(0)
    before = await edge.snapshot(0)
    r = await edge.http.get("/api/v1/clients/zero/task", params={"timeout": 0}, headers=auth())
    detail = detail_of(r, 422)
    assert [e["loc"] for e in detail] == [["path", "client_id"]]
    assert await edge.snapshot(0) == before


# =================================================================================================
# Results
# =================================================================================================
NOT_SAFETENSORS = not_safetensors(result(0), json_body=b'{"task_id": "x", "client_id": 0}')


@pytest.mark.parametrize("case", NOT_SAFETENSORS)
async def test_result_not_safetensors(edge: Edge, case: str) -> None:
    body, fragment = NOT_SAFETENSORS[case]
    await edge.open_tasks(0)
    before = await edge.snapshot(0)
    r = await edge.send_result(0, body)
    detail_of(r, 400, fragment)
    assert await edge.snapshot(0) == before
    assert before["open"] == {0: task_id(0)}


async def test_result_without_message_metadata(edge: Edge) -> None:
    await edge.open_tasks(0)
    before = await edge.snapshot(0)
    r = await edge.send_result(0, encode(zeros_like(task_tensors(0))))
    assert detail_of(r, 400) == "safetensors metadata has no 'message' header"
    assert await edge.snapshot(0) == before


INVALID_HEADERS = {
    "zero-samples": ({"num_samples": 0}, "num_samples"),
    "negative-samples": ({"num_samples": -1}, "num_samples"),
    "loss-nan": ({"loss": float("nan")}, "loss"),
    "loss-inf": ({"loss": float("inf")}, "loss"),
    "missing-task-id": ({"task_id": ...}, "task_id"),
    "empty-task-id": ({"task_id": ""}, "task_id"),
    "missing-loss": ({"loss": ...}, "loss"),
    "negative-client-id": ({"client_id": -1}, "client_id"),
    "extra-field": ({"round": 0}, "round"),
    "string-samples": ({"num_samples": "many"}, "num_samples"),
    "accuracy-above-one": ({"evaluation": {"loss": 0.5, "accuracy": 1.5, "num_samples": 3}}, "accuracy"),
    "evaluation-of-no-samples": ({"evaluation": {"loss": 0.5, "accuracy": 0.5, "num_samples": 0}}, "num_samples"),
}


@pytest.mark.parametrize("case", [*INVALID_HEADERS, "not-json"])
async def test_result_invalid_header(edge: Edge, case: str) -> None:
    await edge.open_tasks(0)
    if case == "not-json":
        message, fragment = "{not json", "json_invalid"
    else:
        changes, fragment = INVALID_HEADERS[case]
        message = result_header(0).model_dump(mode="json")
        for key, value in changes.items():
            message.pop(key) if value is ... else message.__setitem__(key, value)
    before = await edge.snapshot(0)
    r = await edge.send_result(0, raw_message(zeros_like(task_tensors(0)), message))
    detail_of(r, 422, "invalid ClientResultHeader", fragment)
    assert await edge.snapshot(0) == before
    assert before["open"] == {0: task_id(0)}


async def test_result_with_an_evaluation_its_task_did_not_ask_for(edge: Edge) -> None:
    """The harness's run is evaluated on the cloud's test set only: a device evaluation is refused, the task open."""
    await edge.open_tasks(0)
    before = await edge.snapshot(0)
    header = result_header(0).model_copy(update={"evaluation": HeldOut(loss=0.5, accuracy=0.5, num_samples=3)})
    r = await edge.send_result(0, encode(zeros_like(task_tensors(0)), header))
    detail_of(r, 422, "asks for no evaluation", "run evaluation is 'cloud'")
    assert await edge.snapshot(0) == before


async def test_result_num_samples_beyond_float_range(edge: Edge) -> None:
    await edge.open_tasks(0)
    before = await edge.snapshot(0)
    message = {**result_header(0).model_dump(mode="json"), "num_samples": 10**400}
    r = await edge.send_result(0, raw_message(zeros_like(task_tensors(0)), message))
    detail_of(r, 422, "num_samples")
    assert await edge.snapshot(0) == before


async def test_result_client_id_differs_from_url(edge: Edge) -> None:
    await edge.open_tasks(0, 1)
    before = await edge.snapshot(0, 1)
    r = await edge.send_result(0, result(1))
    assert detail_of(r, 422) == "header client_id 1 does not match the URL's 0"
    assert await edge.snapshot(0, 1) == before
    assert before["open"] == {0: task_id(0), 1: task_id(1)}


async def test_result_unregistered_client(edge: Edge) -> None:
    await edge.open_tasks(0)
    before = await edge.snapshot(0)
    r = await edge.send_result(3, result(3))
    assert detail_of(r, 404) == "unknown client 3; register first"
    assert await edge.snapshot(0) == before
    assert 3 not in edge.board.clients


@pytest.mark.parametrize("case", ["old-task-id", "other-clients-task", "no-task-posted"])
async def test_result_for_task_not_open(edge: Edge, case: str) -> None:
    await edge.open_tasks(0, 1)
    await edge.register(2)  # registered, but selected for no task this round
    client_id, stale = {"old-task-id": (0, f"{RUN_ID}-v-1-e0-c0"), "other-clients-task": (0, task_id(1)),
                        "no-task-posted": (2, task_id(2))}[case]
    before = await edge.snapshot(0, 1, 2)
    r = await edge.send_result(client_id, result(client_id, task_id=stale))
    assert detail_of(r, 409) == f"stale result: task {stale!r} is not open for client {client_id}"
    assert await edge.snapshot(0, 1, 2) == before
    assert before["open"] == {0: task_id(0), 1: task_id(1), 2: None}


def _wrong_tensors(case: str) -> tuple[Tensors, str]:
    good = zeros_like(task_tensors(0))
    name = max(sorted(good), key=lambda k: good[k].dim())
    if case == "missing-tensor":
        return {k: v for k, v in good.items() if k != name}, f"missing [{name!r}], unexpected []"
    if case == "renamed-tensor":
        renamed = {("model/renamed" if k == name else k): v for k, v in good.items()}
        return renamed, f"missing [{name!r}], unexpected ['model/renamed']"
    if case == "extra-tensor":
        return {**good, "model/bonus": torch.zeros(1)}, "missing [], unexpected ['model/bonus']"
    if case == "ungrouped-tensor":  # the record codec refuses it before any algorithm sees it
        return {**good, "bonus": torch.zeros(1)}, "tensor 'bonus' names no group"
    if case == "wrong-shape":
        shape = list(good[name].shape)
        return {**good, name: torch.zeros(shape[::-1])}, f"has shape {shape[::-1]}, expected {shape}"
    if case == "flattened":
        return {**good, name: torch.zeros(good[name].numel())}, f"has shape [{good[name].numel()}]"
    if case == "float64":
        return zeros_like(good, torch.float64), "has dtype torch.float64, expected torch.float32"
    if case == "float16":
        return {**good, name: torch.zeros(good[name].shape, dtype=torch.float16)}, "has dtype torch.float16"
    value = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}[case]
    bad = good[name].clone().reshape(-1)
    bad[0] = value
    return {**good, name: bad.reshape(good[name].shape)}, f"tensor {name!r} contains NaN or Inf"


@pytest.mark.parametrize(
    "case", ["missing-tensor", "renamed-tensor", "extra-tensor", "ungrouped-tensor", "wrong-shape", "flattened",
             "float64", "float16", "nan", "inf", "-inf"],
)
async def test_result_wrong_tensors(edge: Edge, case: str) -> None:
    await edge.open_tasks(0)
    tensors, fragment = _wrong_tensors(case)
    before = await edge.snapshot(0)
    r = await edge.send_result(0, encode(tensors, result_header(0)))
    detail_of(r, 422, fragment)
    assert await edge.snapshot(0) == before
    assert before["open"] == {0: task_id(0)}  # the task is still open ...
    ok = await edge.send_result(0, result(0))  # ... and the client may still answer it correctly
    assert ok.status_code == 202 and ok.json() == ACCEPTED, ok.text
    assert [r.client_id for r in edge.board.results()] == [0]


@pytest.mark.parametrize("length", OVERSIZED.values(), ids=OVERSIZED.keys())
async def test_result_oversized(length: str) -> None:
    async with running_edge(max_payload_bytes=1000) as edge:
        await edge.open_tasks(0)
        before = await edge.snapshot(0)
        await assert_refuses_oversized(partial(edge.send_result, 0), result(0), length, 1000)
        assert await edge.snapshot(0) == before
        assert before["open"] == {0: task_id(0)}


@pytest.mark.parametrize("length", OVERSIZED.values(), ids=OVERSIZED.keys())
async def test_register_oversized(length: str) -> None:
    async with running_edge(max_payload_bytes=1000) as edge:
        await edge.open_tasks(0)
        before = await edge.snapshot(0)
        blob = json.dumps({"client_id": 7, "num_samples": 3}).encode() + b" " * 2000

        def post(content: Any, headers: dict[str, str] | None = None) -> Awaitable[httpx.Response]:
            return edge.http.post("/api/v1/clients", content=content,
                                  headers={**auth(), "Content-Type": "application/json", **(headers or {})})

        await assert_refuses_oversized(post, blob, length, 1000)
        assert await edge.snapshot(0) == before
        assert 7 not in edge.board.clients


async def test_result_invalid_content_length(edge: Edge) -> None:
    await edge.open_tasks(0)
    before = await edge.snapshot(0)
    r = await edge.send_result(0, result(0), headers={"Content-Length": "lots"})
    assert detail_of(r, 400) == "invalid Content-Length"
    assert await edge.snapshot(0) == before


async def test_result_duplicate(edge: Edge) -> None:
    await edge.open_tasks(0)
    blob = result(0)
    first = await edge.send_result(0, blob)
    assert first.status_code == 202 and first.json() == ACCEPTED, first.text
    before = await edge.snapshot(0)
    assert before["open"] == {0: None} and len(before["results"]) == 1
    again = await edge.send_result(0, blob)
    assert detail_of(again, 409) == f"duplicate result for task {task_id(0)!r}"
    # A retry with different content is refused the same way; the first answer stands.
    other = await edge.send_result(0, result(0, loss=0.1, num_samples=99))
    assert detail_of(other, 409) == f"duplicate result for task {task_id(0)!r}"
    assert await edge.snapshot(0) == before
    (kept,) = edge.board.results()
    assert (kept.num_samples, kept.loss) == (10, 0.5)


# =================================================================================================
# Large inputs: refused by what the route needs, and never echoed back whole
# =================================================================================================
async def test_a_registration_is_refused_past_a_few_kib_though_tensors_may_take_mib(edge: Edge) -> None:
    body = json.dumps({"client_id": 1, "num_samples": 3}).encode() + b" " * 100_000
    r = await edge.http.post("/api/v1/clients", content=body, headers={**auth(), "Content-Type": "application/json"})
    assert detail_of(r, 413) == f"payload of {len(body)} bytes exceeds the limit of {ClientRegistration.max_body_bytes}"
    assert 1 not in edge.board.clients


@pytest.mark.parametrize("token", ["secret", "own"])
async def test_a_422_quotes_a_large_input_only_briefly(edge: Edge, token: str) -> None:
    """A registration with a 50 kB field it should not have: the 422 names it without echoing it (it
    echoed all of it back: 20 MB took 12 s)."""
    body = {"client_id": 1, "extra": "x" * 50_000, **{f"also{i}": i for i in range(100)}}
    headers = auth(CLIENT_TOKEN if token == "secret" else client_token(CLIENT_TOKEN, 1))
    r = await edge.http.post("/api/v1/clients", json=body, headers=headers)
    detail = detail_of(r, 422, "extra", "Extra inputs are not permitted", "more not shown")
    assert len(r.content) < 6000, len(r.content)
    assert len(detail) == 21  # 20 errors shown, and how many more there are


async def test_a_422_quotes_the_input_as_json_a_few_items_deep(edge: Edge) -> None:
    """The input a 422 quotes is JSON, as the caller sent it (not Python's repr of it), cut a few levels and
    items deep."""
    body = {"clientid": 1, "nested": {"a": [1, 2, 3, 4, 5, 6, {"deep": {"er": 1}}], "b": None, "c": True},
            **{f"k{i}": "v" for i in range(3)}}
    r = await edge.http.post("/api/v1/clients", json=body, headers=auth())
    missing = next(e for e in detail_of(r, 422, "client_id") if e["type"] == "missing")
    assert missing["input"] == {"clientid": 1, "nested": {"a": [1, 2, 3, 4, "… 3 more items"], "b": None, "c": True},
                                "k0": "v", "k1": "v", "…": "1 more keys"}


async def test_a_422_of_a_tensor_header_does_not_echo_it(edge: Edge) -> None:
    await edge.open_tasks(0)
    header = {**result_header(0).model_dump(mode="json"), "padding": "x" * 1_000_000}
    r = await edge.send_result(0, raw_message(zeros_like(task_tensors(0)), header))
    detail_of(r, 422, "invalid ClientResultHeader", "padding")
    assert len(r.content) < 2000, len(r.content)


async def test_registrations_and_results_past_the_rate_limit_get_429_per_client() -> None:
    async with running_edge(rate_limit="3/minute") as edge:
        statuses = [(await edge.http.post("/api/v1/clients", json={"client_id": 5}, headers=auth())).status_code
                    for _ in range(4)]
        assert statuses == [200, 200, 200, 429]
        r = await edge.http.post("/api/v1/clients", json={"client_id": 5}, headers=auth())
        assert detail_of(r, 429, "more than 3 per 1 minute") and 1 <= int(r.headers["Retry-After"]) <= 60
        # Another client, even behind the same secret, has its own allowance; results count apart.
        assert (await edge.http.post("/api/v1/clients", json={"client_id": 6}, headers=auth())).status_code == 200
        await edge.open_tasks(0)
        for _ in range(3):
            await edge.send_result(0, b"not safetensors")
        detail_of(await edge.send_result(0, result(0)), 429)
        assert edge.board.results() == []


async def test_long_polls_past_the_open_requests_per_client_get_429_and_spare_the_others() -> None:
    """One device's token could hold every connection of an edge with long-polls (49 on a 50-connection
    edge answered every other client, and /health, 503): each client may keep max_open_per_caller open."""
    async with running_edge(max_open_per_caller=2) as edge:
        for client_id in (1, 2):
            await edge.register(client_id)

        def poll(client_id: int) -> Awaitable[httpx.Response]:
            return edge.http.get(f"/api/v1/clients/{client_id}/task", params={"timeout": 2}, headers=auth())

        held = [asyncio.ensure_future(poll(1)) for _ in range(2)]
        await asyncio.sleep(0.3)  # both polls are open
        third = await poll(1)
        assert detail_of(third, 429, "2 task requests for 1 are open already") and third.headers["Retry-After"] == "1"
        # A batch poll counts with its first id's: it is no way around the cap.
        batch = await edge.http.post("/api/v1/clients/tasks", json={"client_ids": [1, 2], "timeout": 0},
                                     headers=auth())
        assert detail_of(batch, 429, "2 task requests for 1 are open already")
        assert (await poll(2)).status_code == 204  # another client has its own
        assert [r.status_code for r in await asyncio.gather(*held)] == [204, 204]
        assert (await poll(1)).status_code == 204  # released once answered
