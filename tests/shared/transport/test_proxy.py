"""Edges, clients and fedctl dial out through the proxy their environment names (HTTP_PROXY, NO_PROXY).

httpx honours those variables only for transports it builds itself; ours wrap one in retries, so the
proxy is looked up explicitly. A forward proxy receives the request in absolute form ("GET http://…")."""
from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest

from fl_services.fedctl.api import CloudAPI
from fl_services.shared.wire.http import env_proxy, make_client

pytestmark = pytest.mark.anyio


@contextlib.asynccontextmanager
async def recording_proxy() -> AsyncIterator[tuple[str, list[str]]]:
    """A stand-in forward proxy on loopback: records each request line and answers 200 with a JSON body."""
    lines: list[str] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        lines.append((await reader.readline()).decode().strip())
        while (await reader.readline()) not in (b"\r\n", b""):
            pass
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n"
                     b"Connection: close\r\n\r\n{}")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        yield f"http://127.0.0.1:{port}", lines


async def test_an_edge_or_client_dials_through_the_environments_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    async with recording_proxy() as (proxy, lines):
        monkeypatch.setenv("HTTP_PROXY", proxy)
        monkeypatch.delenv("NO_PROXY", raising=False)
        monkeypatch.delenv("no_proxy", raising=False)
        async with make_client("http://edge.invalid:8100", "token") as http:
            # Bounded: without the proxy, the retries would redial the unresolvable host for good.
            async with asyncio.timeout(10):
                response = await http.get("/health")
    assert response.status_code == 200
    assert lines == ["GET http://edge.invalid:8100/health HTTP/1.1"]


async def test_fedctl_dials_through_the_environments_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    async with recording_proxy() as (proxy, lines):
        monkeypatch.setenv("HTTP_PROXY", proxy)
        monkeypatch.delenv("NO_PROXY", raising=False)
        monkeypatch.delenv("no_proxy", raising=False)
        with CloudAPI("http://cloud.invalid:8000", "admin") as api:
            response = await asyncio.to_thread(api.http.get, "/health")
    assert response.status_code == 200
    assert lines == ["GET http://cloud.invalid:8000/health HTTP/1.1"]


def test_no_proxy_and_no_variables_mean_a_direct_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy",
                 "NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    assert env_proxy("http://edge.example:8100") is None
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.example:3128")
    assert env_proxy("https://edge.example") == "http://proxy.example:3128"
    assert env_proxy("http://edge.example") is None  # only https goes through it
    monkeypatch.setenv("ALL_PROXY", "http://all.example:3128")
    assert env_proxy("http://edge.example") == "http://all.example:3128"
    monkeypatch.setenv("NO_PROXY", "edge.example,.lab")
    assert env_proxy("https://edge.example") is None
    assert env_proxy("https://device.lab") is None
    assert env_proxy("https://cloud.example") == "http://proxy.example:3128"
