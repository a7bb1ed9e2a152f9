"""Retries as a transport: httpx.MockTransport (httpx's own test transport) plays the server underneath."""
from __future__ import annotations

import logging
from functools import partial

import httpx
import pytest

from fl_services.shared.wire.backoff import Backoff
from fl_services.shared.wire.http import make_client
from fl_services.shared.wire.retry import DEDUPLICATED, RetryTransport, SyncRetryTransport

pytestmark = pytest.mark.anyio
FAST = partial(Backoff, 0.001, 0.004)


def server(*answers) -> tuple[httpx.MockTransport, list[str]]:
    """Answers requests with `answers` in turn: a status code, or an exception to raise (a dropped connection)."""
    seen, queue = [], list(answers)

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request.method)
        answer = queue.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return httpx.Response(answer, text=f"answer {answer}")

    return httpx.MockTransport(handle), seen


def client(inner: httpx.MockTransport, attempts: int | None = None) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url="http://server", transport=RetryTransport(inner, attempts, FAST))


def waits(caplog) -> list[float]:
    return [r.args[-1] for r in caplog.records if r.name == "fl_services.shared.wire.retry" and "retrying in" in r.msg]


async def test_a_read_goes_through_a_503_and_a_dropped_connection(caplog):
    caplog.set_level(logging.WARNING)
    inner, seen = server(503, httpx.RemoteProtocolError("server disconnected"), httpx.ConnectError("refused"), 200)
    async with client(inner) as http:
        response = await http.get("/x")
    assert response.status_code == 200 and response.text == "answer 200"
    assert seen == ["GET"] * 4
    assert len(waits(caplog)) == 3 and "HTTP 503: answer 503" in caplog.text


async def test_a_write_without_deduplication_is_sent_once():
    inner, seen = server(503)
    async with client(inner) as http:
        assert (await http.post("/x", content=b"body")).status_code == 503
    assert seen == ["POST"]
    inner, seen = server(httpx.ConnectError("refused"))
    async with client(inner) as http:
        with pytest.raises(httpx.ConnectError):
            await http.post("/x", content=b"body")
    assert seen == ["POST"]


async def test_a_deduplicated_write_is_retried_with_its_body():
    bodies = []

    def handle(request: httpx.Request) -> httpx.Response:
        bodies.append(request.read())
        return httpx.Response(502 if len(bodies) < 3 else 202)

    async with client(httpx.MockTransport(handle)) as http:
        response = await http.post("/x", content=b"contribution", extensions=DEDUPLICATED)
    assert response.status_code == 202 and bodies == [b"contribution"] * 3


async def test_a_rate_limited_request_of_any_kind_is_sent_again_after_its_retry_after(caplog):
    # 429: the server refused to act on it, so even a write that is not deduplicated may be sent again.
    caplog.set_level(logging.WARNING)
    answers = [httpx.Response(429, headers={"Retry-After": "0.01"}), httpx.Response(429), httpx.Response(202)]
    seen = []

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request.read())
        return answers.pop(0)

    async with client(httpx.MockTransport(handle)) as http:
        assert (await http.post("/x", content=b"result")).status_code == 202
    assert seen == [b"result"] * 3
    assert waits(caplog)[0] >= 0.01  # Retry-After, over the backoff's first 0.001 s


async def test_client_errors_are_final():
    inner, seen = server(404)
    async with client(inner) as http:
        assert (await http.get("/x")).status_code == 404
    assert seen == ["GET"]


async def test_gives_up_after_the_bound_with_the_last_fault(caplog):
    caplog.set_level(logging.WARNING)
    inner, seen = server(500, 500, 500, 200)
    async with client(inner, attempts=3) as http:
        response = await http.get("/x")
    assert response.status_code == 500 and response.text == "answer 500" and seen == ["GET"] * 3
    assert waits(caplog) == [0.001, 0.002]
    inner, seen = server(500, httpx.ConnectError("refused"), 200)
    async with client(inner, attempts=2) as http:
        with pytest.raises(httpx.ConnectError):
            await http.get("/x")
    assert seen == ["GET"] * 2


async def test_without_a_bound_it_retries_until_the_answer_comes(caplog):
    caplog.set_level(logging.WARNING)
    inner, seen = server(*[503] * 6, 200)
    async with client(inner) as http:
        assert (await http.get("/x")).status_code == 200
    assert len(seen) == 7
    assert waits(caplog) == [0.001, 0.002, 0.004, 0.004, 0.004, 0.004]  # the backoff's cap


def test_the_synchronous_variant_follows_the_same_rules(monkeypatch):
    slept: list[float] = []
    monkeypatch.setattr("fl_services.shared.wire.retry.time.sleep", slept.append)
    inner, seen = server(503, httpx.ConnectError("refused"), 200, 503, 500, 500, 500)
    with httpx.Client(base_url="http://server", transport=SyncRetryTransport(inner, 3)) as http:
        assert http.get("/x").status_code == 200
        assert http.post("/x").status_code == 503  # sent once
        assert http.post("/x", extensions=DEDUPLICATED).status_code == 500  # three attempts, then the fault
    assert seen == ["GET"] * 3 + ["POST"] * 4
    assert slept == [0.2, 0.4, 0.2, 0.4]  # the default policy, afresh for each request


async def test_edges_and_clients_retry_at_jittered_delays(caplog):
    """Devices that lost their server together must not all come back at the same instant: each delay of
    the default policy (0.2 s doubling) is drawn from its upper half."""
    caplog.set_level(logging.WARNING)
    inner, _ = server(503, 503, 503, 200)
    async with make_client("http://server", "token", transport=inner) as http:
        assert (await http.get("/x")).status_code == 200
    drawn = waits(caplog)
    assert len(drawn) == 3 and drawn != [0.2, 0.4, 0.8]
    assert all(d / 2 <= w <= d for w, d in zip(drawn, [0.2, 0.4, 0.8], strict=True)), drawn
