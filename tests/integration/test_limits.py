"""What a misbehaving or hostile peer meets at the services' sockets, as real processes: a request head or
body trickled a byte at a time (slowloris) is dropped, and a body far over what its route needs is refused
before it has been sent, whatever token comes with it, while /health keeps answering. Bounded: 40
connections at most, each given up after 15 s."""
from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import httpx
import pytest

from fl_services.fedctl.launch import LocalTopology
from fl_services.shared.wire.protocol import client_token

pytestmark = pytest.mark.slow

DEADLINE_S = 2.0  # the services' header and body deadlines here
GIVE_UP_S = 15.0
SLOW_PEERS = 40


@pytest.fixture(scope="module")
def topology(tmp_path_factory) -> Iterator[LocalTopology]:
    env = {f"FL_{service}_{name}": str(DEADLINE_S) for service in ("CLOUD", "EDGE")
           for name in ("HEADER_TIMEOUT_S", "BODY_TIMEOUT_S")}
    with LocalTopology(num_clients=0, num_edges=1, workdir=tmp_path_factory.mktemp("limits"), extra_env=env) as topo:
        yield topo


def url_of(topology: LocalTopology, service: str) -> httpx.URL:
    return httpx.URL(topology.cloud_url if service == "cloud" else topology.edges[0].address())


async def trickle(url: httpx.URL, head: bytes, then: bytes) -> tuple[bytes, float]:
    """Sends `head` at once, then `then` one byte every 2 s, reading meanwhile: what the server answered
    (b"" if nothing) and when it closed the connection (GIVE_UP_S if it never did)."""
    reader, writer = await asyncio.open_connection(url.host, url.port)
    started, answer = time.monotonic(), b""
    try:
        writer.write(head)
        for byte in [then[i:i + 1] for i in range(len(then))]:
            try:
                async with asyncio.timeout(2.0):
                    while chunk := await reader.read(65536):
                        answer += chunk
                    return answer, time.monotonic() - started  # closed by the server
            except TimeoutError:
                pass
            if time.monotonic() - started > GIVE_UP_S:
                break
            writer.write(byte)
        return answer, GIVE_UP_S
    except ConnectionError:
        return answer, time.monotonic() - started
    finally:
        writer.close()


async def health_meanwhile(url: httpx.URL, work) -> tuple[list, list[int]]:
    """`work`'s results, and /health's status every 0.5 s while it ran."""
    task = asyncio.ensure_future(work)
    seen = []
    async with httpx.AsyncClient(base_url=str(url), timeout=5) as http:
        while not task.done():
            try:
                seen.append((await http.get("/health")).status_code)
            except httpx.HTTPError:
                seen.append(0)
            await asyncio.sleep(0.5)
    return await task, seen


@pytest.mark.parametrize("service", ["cloud", "edge"])
def test_a_request_head_sent_a_byte_at_a_time_is_dropped(topology, service):
    url = url_of(topology, service)
    head = b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 100 + b"\r\n\r\n"

    async def slowloris():
        return await asyncio.gather(*[trickle(url, b"", head) for _ in range(SLOW_PEERS)])

    results, health = asyncio.run(health_meanwhile(url, slowloris()))
    held = sorted(round(s, 1) for _, s in results)
    print(f"\n{service}: {SLOW_PEERS} slow heads held {held[0]}-{held[-1]} s; /health meanwhile {health}")
    assert all(answer == b"" for answer, _ in results)  # dropped, never served
    assert held[-1] < GIVE_UP_S, held
    assert set(health) == {200}


@pytest.mark.parametrize("service", ["cloud", "edge"])
def test_a_body_sent_a_byte_at_a_time_gets_408(topology, service):
    url = url_of(topology, service)
    if service == "cloud":
        path, token = "/api/v1/edges/{}/contributions", topology.edge_token
    else:
        path, token = "/api/v1/clients/{}/results", topology.client_token

    def head(caller: int) -> bytes:  # each its own edge or client: none exceeds its rate limit
        return (f"POST {path.format(caller)} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n"
                "Content-Type: application/vnd.safetensors\r\nContent-Length: 1000\r\n\r\n").encode()

    async def slow_bodies():
        return await asyncio.gather(*[trickle(url, head(k), b"\0" * 1000) for k in range(SLOW_PEERS)])

    results, health = asyncio.run(health_meanwhile(url, slow_bodies()))
    held = sorted(round(s, 1) for _, s in results)
    print(f"\n{service}: {SLOW_PEERS} slow bodies held {held[0]}-{held[-1]} s; /health meanwhile {health}")
    assert all(answer.startswith(b"HTTP/1.1 408 ") for answer, _ in results), {a[:40] for a, _ in results}
    assert held[-1] < GIVE_UP_S, held
    assert set(health) == {200}


async def first_answer(url: httpx.URL, head: bytes, sent: bytes) -> bytes:
    """The status line the server answers after `head` and only `sent` of the body it announces
    (b"" if none within 10 s: it waits for the rest)."""
    reader, writer = await asyncio.open_connection(url.host, url.port)
    try:
        writer.write(head + sent)
        async with asyncio.timeout(10):
            return await reader.readline()
    except (TimeoutError, ConnectionError):
        return b""
    finally:
        writer.close()


def registration(path: str, token: str, length: int | None) -> bytes:
    framing = f"Content-Length: {length}" if length is not None else "Transfer-Encoding: chunked"
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n"
            f"Content-Type: application/json\r\n{framing}\r\n\r\n").encode()


MB = 10**6


@pytest.mark.parametrize("framing", ["content-length", "chunked"])
def test_a_huge_registration_is_refused_before_it_is_sent_whatever_its_token(topology, framing):
    """60 MB announced (or streamed without a length), 1.2 MB sent: each is refused (413; 401 where the
    token alone decides) without the server waiting for the rest, four at once per token."""
    length = 60 * MB if framing == "content-length" else None
    part = b'{"client_id": 1, "padding": "' + b"a" * 1_200_000  # over a run config's 1 MiB too
    if length is None:
        part = f"{len(part):x}\r\n".encode() + part + b"\r\n"
    edge, cloud = url_of(topology, "edge"), url_of(topology, "cloud")
    cases = {  # (service, path, token): the answer expected
        # A token the edge can verify without the body (its secret, an issued device token) is told the body is too
        # large; any other is refused as a credential first, nothing of the body read: a derived token names its
        # client only in the body it would take reading to check.
        (edge, "/api/v1/clients", "wrong-token"): b"401",
        (edge, "/api/v1/clients", client_token(topology.client_token, 1)): b"401",
        (edge, "/api/v1/clients", topology.client_token): b"413",
        (cloud, "/api/v1/edges", "wrong-token"): b"401",
        (cloud, "/api/v1/edges", topology.edge_token): b"413",
        (cloud, "/api/v1/runs", topology.admin_token): b"413",
    }

    async def send_all():
        return await asyncio.gather(*[first_answer(url, registration(path, token, length), part)
                                      for url, path, token in cases for _ in range(4)])

    answers, health = asyncio.run(health_meanwhile(edge, send_all()))
    expected = [status for status in cases.values() for _ in range(4)]
    assert [answer[9:12] for answer in answers] == expected, answers
    assert set(health) == {200}
