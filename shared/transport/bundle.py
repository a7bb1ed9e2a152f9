"""Several task messages in one body: the edge's answer to a client process's batch long-poll.

Layout: an 8-byte little-endian length, a JSON index of that length (a list of {"client_id", "task_id",
"size"}), then each item's message (one safetensors document) in index order. The index names each item
before its bytes are read, so a message that fails to decode is still known by its client and task.
"""
from __future__ import annotations

import json
import struct
from collections.abc import Sequence

from pydantic import BaseModel, Field, TypeAdapter, ValidationError

from shared.transport.tensors import PayloadError

_LENGTH = struct.Struct("<Q")


class BundleItem(BaseModel):
    client_id: int = Field(ge=0)
    task_id: str = Field(min_length=1, max_length=64)
    size: int = Field(ge=0)


_INDEX = TypeAdapter(list[BundleItem])


def pack(items: Sequence[tuple[int, str, bytes]]) -> bytes:
    """(client_id, task_id, message) triples as one body."""
    index = json.dumps([{"client_id": k, "task_id": t, "size": len(blob)} for k, t, blob in items],
                       separators=(",", ":")).encode()
    return b"".join([_LENGTH.pack(len(index)), index, *(blob for _, _, blob in items)])


def unpack(body: bytes) -> list[tuple[BundleItem, bytes]]:
    """The items `pack` wrote; PayloadError if the body is not such a bundle."""
    if len(body) < _LENGTH.size:
        raise PayloadError("task bundle is too short")
    (length,) = _LENGTH.unpack_from(body)
    start = _LENGTH.size + length
    if start > len(body):
        raise PayloadError("task bundle index length exceeds the body")
    try:
        index = _INDEX.validate_json(body[_LENGTH.size : start])
    except ValidationError as exc:
        raise PayloadError(f"task bundle index is invalid: {exc.errors(include_url=False, include_input=False)}"
                           ) from exc
    if start + sum(item.size for item in index) != len(body):
        raise PayloadError("task bundle sizes do not add up to its body")
    view, items = memoryview(body), []
    for item in index:
        items.append((item, bytes(view[start : start + item.size])))
        start += item.size
    return items
