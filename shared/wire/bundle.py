"""Several messages in one body: the edge's answer to a client process's batch long-poll (tasks), and a client
process's upload of many of its logical clients' results at once.

The tasks of a round mostly send the same tensors (FedAvg's global state) under different headers, so a
bundle carries each distinct tensor data once: an item is its message's head (the safetensors length and
JSON header, which hold the task header) and a reference to a shared data segment; head + segment is the
whole message, byte for byte what the per-client route sends. 500 tasks of a 44k-parameter CNN are 88 MB
as whole messages; as heads and one segment, about 1.5 MB. Results share no tensors: each is its whole message as
its head, with one empty segment.

Layout: an 8-byte little-endian length, a JSON index of that length ({"items": [{"client_id", "task_id",
"head", "data"}], "segments": [sizes]}: "head" the head's size, "data" its segment's position), the heads
in item order, then the segments. The index names each item before its bytes are read, so a message that
fails to decode is still known by its client and task.
"""
from __future__ import annotations

import json
import struct
from collections.abc import Sequence
from dataclasses import dataclass

from pydantic import BaseModel, Field, ValidationError

from fl_services.shared.core.tensors import PayloadError

_LENGTH = struct.Struct("<Q")


class _Item(BaseModel):
    client_id: int = Field(ge=0)
    task_id: str = Field(min_length=1, max_length=64)
    head: int = Field(ge=0)
    data: int = Field(ge=0)


class _Index(BaseModel):
    items: list[_Item]
    segments: list[int] = Field(default_factory=list)


@dataclass(frozen=True)
class BundleItem:
    """One task of a bundle: its message is `head + data` (`data` shared with the other tasks sending it)."""

    client_id: int
    task_id: str
    head: bytes
    data: bytes

    def message(self) -> bytes:
        return self.head + self.data


def pack(items: Sequence[tuple[int, str, bytes, bytes]]) -> bytes:
    """(client_id, task_id, head, data) as one body; equal `data` objects (by identity) are sent once."""
    segments: dict[int, int] = {}  # id(data) -> position
    blobs: list[bytes] = []
    index = []
    for client_id, task_id, head, data in items:
        position = segments.setdefault(id(data), len(blobs))
        if position == len(blobs):
            blobs.append(data)
        index.append({"client_id": client_id, "task_id": task_id, "head": len(head), "data": position})
    raw = json.dumps({"items": index, "segments": [len(b) for b in blobs]}, separators=(",", ":")).encode()
    return b"".join([_LENGTH.pack(len(raw)), raw, *(head for _, _, head, _ in items), *blobs])


def unpack(body: bytes) -> list[BundleItem]:
    """The items `pack` wrote; PayloadError if the body is not such a bundle."""
    if len(body) < _LENGTH.size:
        raise PayloadError("bundle is too short")
    (length,) = _LENGTH.unpack_from(body)
    start = _LENGTH.size + length
    if start > len(body):
        raise PayloadError("bundle index length exceeds the body")
    try:
        index = _Index.model_validate_json(body[_LENGTH.size : start])
    except ValidationError as exc:
        raise PayloadError(f"bundle index is invalid: {exc.errors(include_url=False, include_input=False)}"
                           ) from exc
    if any(item.data >= len(index.segments) for item in index.items) or any(s < 0 for s in index.segments):
        raise PayloadError("bundle refers to a data segment it does not hold")
    if start + sum(item.head for item in index.items) + sum(index.segments) != len(body):
        raise PayloadError("bundle sizes do not add up to its body")
    view = memoryview(body)
    heads = []
    for item in index.items:
        heads.append(bytes(view[start : start + item.head]))
        start += item.head
    segments = []
    for size in index.segments:
        segments.append(bytes(view[start : start + size]))
        start += size
    return [BundleItem(item.client_id, item.task_id, head, segments[item.data])
            for item, head in zip(index.items, heads, strict=True)]
