"""What the endpoint tests of both services check and send: 4xx details, raw and broken bodies."""
from __future__ import annotations

import asyncio
import json
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
from safetensors.torch import save as st_save

from fl_services.shared.core.tensors import Tensors


def bearer(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


def detail_of(response: httpx.Response, status: int, *fragments: str) -> Any:
    """Asserts the status, a JSON `detail`, and that the detail mentions every fragment."""
    assert response.status_code == status, (response.status_code, response.text)
    assert response.headers["content-type"].startswith("application/json"), response.headers
    detail = response.json()["detail"]
    assert detail, response.text
    text = detail if isinstance(detail, str) else json.dumps(detail)
    for fragment in fragments:
        assert fragment in text, (fragment, text)
    return detail


def raw_message(tensors: Tensors, message: Any) -> bytes:
    """A safetensors document whose `message` metadata is arbitrary text (to send invalid headers)."""
    text = message if isinstance(message, str) else json.dumps(message)
    return st_save({k: v.contiguous() for k, v in tensors.items()}, metadata={"message": text})


async def chunks(blob: bytes, size: int = 256) -> AsyncIterator[bytes]:
    """A body streamed in pieces, so the server cannot trust a length it was told up front."""
    for i in range(0, len(blob), size):
        yield blob[i : i + size]


def not_safetensors(valid: bytes, json_body: bytes) -> dict[str, tuple[bytes, str]]:
    """Bodies that are not a safetensors document, by case: (body, a fragment of the 400 detail).

    `valid` is a well-formed message of the endpoint (its first tensor entry is corrupted for one case),
    `json_body` what a client that posts JSON by mistake would send.
    """
    (header_len,) = struct.unpack("<Q", valid[:8])
    header = valid[8:8 + header_len].decode()
    entries = {k: v for k, v in json.loads(header).items() if k != "__metadata__"}
    dtype = next(iter(entries.values()))["dtype"]
    broken_entry = header.replace(f'"{dtype}"', f'"{"X" * len(dtype)}"', 1).encode()  # no such dtype, same length
    meta = json.dumps(json.loads(header).get("__metadata__", {}))
    entry = '{"dtype": "%s", "shape": [4], "data_offsets": [0, %d]}'

    def document(tensors: str, data: bytes) -> bytes:
        text = ('{"__metadata__": %s, %s}' % (meta, tensors)).encode()
        return struct.pack("<Q", len(text)) + text + data

    deep = b'{"__metadata__": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    huge = b'{"w": {"dtype": "U8", "shape": [' + b"4" * 5000 + b'], "data_offsets": [0, 4]}}'
    return {
        "empty": (b"", "too short"),
        "short": (b"abc", "too short"),
        "json-body": (json_body, "header length exceeds the body"),
        "header-length-lies": (struct.pack("<Q", 10**6) + b"{}", "header length exceeds the body"),
        "header-not-json": (struct.pack("<Q", 5) + b"{{{{{", "header is not JSON"),
        "header-not-utf8": (struct.pack("<Q", 4) + b"\xff\xfe\xfd\xfc", "header is not JSON"),
        "header-array": (struct.pack("<Q", 2) + b"[]", "header is not a JSON object"),
        "header-null": (struct.pack("<Q", 4) + b"null", "header is not a JSON object"),
        "header-number": (struct.pack("<Q", 2) + b"42", "header is not a JSON object"),
        "metadata-not-object": (struct.pack("<Q", 22) + b'{"__metadata__": [1]}\x20', "__metadata__ is not an object"),
        "truncated-data": (valid[:-8], "malformed safetensors"),
        "bad-tensor-entry": (valid[:8] + broken_entry + valid[8 + header_len:], "malformed safetensors"),
        # A dtype safetensors knows but this torch has no type for (it raised KeyError: a 500).
        "unsupported-dtype": (document('"w": ' + entry % ("F8_E8M0", 4), bytes(4)), "unsupported safetensors dtype"),
        # The same tensor name twice (json keeps the last one silently).
        "duplicate-tensor-name": (document(", ".join(['"w": ' + entry % ("U8", 4)] * 2), bytes(4)), "duplicate keys"),
        # Nested 100,000 deep: json.loads raised RecursionError (a 500).
        "header-nested-deeply": (struct.pack("<Q", len(deep)) + deep, "nested too deeply"),
        # An integer of 5,000 digits: json.loads raised a plain ValueError at Python's digit limit (a 500).
        "header-integer-too-long": (struct.pack("<Q", len(huge)) + huge, "header is not JSON"),
    }


# How a body larger than the payload limit can arrive: its length told truly, told falsely, or not at all.
OVERSIZED = {"content-length-honest": "honest", "content-length-lies": "lying",
             "chunked-no-content-length": "absent"}


async def assert_refuses_oversized(send: Callable[..., Awaitable[httpx.Response]], blob: bytes, length: str,
                                   limit: int, counted: int | None = None) -> None:
    """`send(body, headers=...)` posts `blob` (over `limit` bytes) with an honest, a lying or no
    Content-Length; each way it must be refused with 413 before the route sees it. `counted`: the route's
    own limit, where it is smaller (it cuts off a body streamed in pieces first)."""
    assert len(blob) > limit
    counted = limit if counted is None else counted
    if length == "honest":
        r = await send(blob)
        assert r.request.headers["content-length"] == str(len(blob))
        assert detail_of(r, 413) == f"payload of {len(blob)} bytes exceeds the limit of {limit}"
    elif length == "lying":
        r = await send(blob, headers={"Content-Length": "100"})
        assert r.request.headers["content-length"] == "100"
        assert detail_of(r, 413) == f"payload exceeds the limit of {limit} bytes"  # the body came in one piece
    else:
        r = await send(chunks(blob))
        assert "content-length" not in r.request.headers
        assert detail_of(r, 413) == f"payload exceeds the limit of {counted} bytes"


async def status_of(url: str, method: str, path: str, headers: dict[str, str] | None = None,
                    body: bytes = b"", timeout: float = 60.0) -> int:
    """One request on its own connection, its answer's status (0: none within `timeout`, or the connection
    failed). For load tests: a thousand of these cost the test process far less than httpx requests do."""
    parsed = httpx.URL(url)
    head = "".join(f"{k}: {v}\r\n" for k, v in {"Host": parsed.host, "Connection": "close",
                                                 "Content-Length": str(len(body)), **(headers or {})}.items())
    try:
        async with asyncio.timeout(timeout):
            reader, writer = await asyncio.open_connection(parsed.host, parsed.port)
            try:
                writer.write(f"{method} {path} HTTP/1.1\r\n{head}\r\n".encode() + body)
                status_line = await reader.readline()
                await reader.read()  # to the end: the server closes once it has answered
            finally:
                writer.close()
        return int(status_line.split(b" ", 2)[1])
    except (OSError, TimeoutError, IndexError, ValueError):
        return 0
