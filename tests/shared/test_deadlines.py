"""The servers' read deadlines and head cap (shared/server/deadlines.py), for both of uvicorn's protocols, on a real
socket: a head that does not arrive in time, or a body still coming after its answer, loses its connection; a
head over 16 KiB is answered 400; the rest is served as uvicorn serves it. (tests/integration/test_limits.py
meets the same at the services themselves, with 40 slow peers at once.)"""
from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from fl_services.shared.server.deadlines import MAX_HEAD_BYTES, h11_with_deadlines, httptools_with_deadlines

# Long enough that a loaded machine still reads a prompt head well inside it; the idle wait in the kept-connection
# test (twice this) stays under uvicorn's 5 s keep-alive.
DEADLINE_S = 1.5


async def echo_length(request: Request) -> Response:
    return Response(str(len(await request.body())))


async def refuse(request: Request) -> Response:  # answers before reading the body, as a 401 or 413 does
    return Response("too large", status_code=413)


@pytest.fixture(scope="module", params=[httptools_with_deadlines, h11_with_deadlines], ids=["httptools", "h11"])
def port(request) -> Iterator[int]:
    app = Starlette(routes=[Route("/echo", echo_length, methods=["GET", "POST"]),
                            Route("/refuse", refuse, methods=["POST"])])
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        free = probe.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=free, log_config=None, log_level="warning",
                                           http=request.param(DEADLINE_S)))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    yield free
    server.should_exit = True
    thread.join(10)


def connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=10)


def read_until_closed(conn: socket.socket) -> tuple[bytes, float]:
    """What the server sent until it closed the connection, and how long that took. A server that closes with
    bytes of ours still unread resets the connection (RST, not FIN); what it sent before is still read first."""
    started, answer = time.monotonic(), b""
    try:
        while chunk := conn.recv(65536):
            answer += chunk
    except ConnectionResetError:
        pass
    return answer, time.monotonic() - started


def answer_of(conn: socket.socket, request: bytes) -> bytes:
    conn.sendall(request)
    answer = b""
    while b"\r\n\r\n" not in answer or not answer.split(b"\r\n\r\n", 1)[1]:
        answer += conn.recv(65536)
    return answer


def get(path: str = "/echo", extra: bytes = b"") -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: x\r\n".encode() + extra + b"\r\n"


def test_a_head_that_does_not_arrive_in_time_loses_its_connection(port):
    with connect(port) as conn:
        conn.sendall(get()[:20])  # then nothing
        answer, took = read_until_closed(conn)
    assert answer == b""
    assert DEADLINE_S * 0.8 < took < DEADLINE_S + 5


def test_a_head_trickled_is_cut_at_the_deadline_from_its_first_byte(port):
    with connect(port) as conn:
        started = time.monotonic()
        with pytest.raises(OSError):  # reset or broken pipe once the server has closed
            for byte in get():
                conn.sendall(bytes([byte]))
                time.sleep(DEADLINE_S / 5)
                if time.monotonic() - started > DEADLINE_S + 5:
                    break
        assert time.monotonic() - started < DEADLINE_S + 5


@pytest.mark.parametrize("in_pieces", [False, True], ids=["at once", "in pieces"])
def test_a_head_over_the_cap_is_answered_400(port, in_pieces, request):
    if not in_pieces and request.node.callspec.id.startswith("h11"):
        pytest.skip("h11 caps only what it holds of a head still incomplete; one read of a whole head it parses")
    head = get(extra=b"X-Big: " + b"a" * (2 * MAX_HEAD_BYTES) + b"\r\n")
    with connect(port) as conn:
        if in_pieces:
            try:
                for start in range(0, len(head), 4096):
                    conn.sendall(head[start:start + 4096])
                    time.sleep(0.01)
            except (BrokenPipeError, ConnectionResetError):
                pass  # closed once its answer went out, our unread bytes making it a reset: the answer is still there
        else:
            conn.sendall(head)
        answer, _ = read_until_closed(conn)
    assert answer.startswith(b"HTTP/1.1 400 "), answer[:60]


def test_a_head_under_the_cap_with_a_large_body_is_served(port):
    body = b"\0" * (4 * MAX_HEAD_BYTES)
    request = (b"POST /echo HTTP/1.1\r\nHost: x\r\nX-Fill: " + b"a" * (MAX_HEAD_BYTES // 2)
               + f"\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
    with connect(port) as conn:
        answer = answer_of(conn, request)
    assert answer.startswith(b"HTTP/1.1 200 ") and answer.endswith(str(len(body)).encode()), answer


def test_a_kept_connection_idle_past_the_deadline_serves_its_next_request(port):
    with connect(port) as conn:
        assert answer_of(conn, get()).startswith(b"HTTP/1.1 200 ")
        time.sleep(DEADLINE_S * 2)  # under uvicorn's keep-alive (5 s): the head deadline starts at a first byte
        assert answer_of(conn, get()).startswith(b"HTTP/1.1 200 ")


def test_a_body_still_coming_after_its_answer_is_not_waited_for(port):
    head = b"POST /refuse HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n"
    with connect(port) as conn:
        conn.sendall(head + b"\0" * 10)  # and no more
        answer, took = read_until_closed(conn)
    assert answer.startswith(b"HTTP/1.1 413 ")
    assert took < DEADLINE_S + 5


def test_a_malformed_request_is_answered_400(port):
    with connect(port) as conn:
        conn.sendall(b"NOT HTTP AT ALL\r\n\r\n")
        answer, _ = read_until_closed(conn)
    assert answer.startswith(b"HTTP/1.1 400 ")
