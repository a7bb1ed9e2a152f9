"""Algorithm state as named groups: a `Record` maps a group name to its `Tensors`.

Like Flower's RecordDict of named ArrayRecords, an algorithm's global state, tasks, results,
contributions and memories are records such as {"model": w, "control": c}: the algorithms never invent
name prefixes nor parse them back. Only this codec flattens a record into one safetensors document (and
back): tensor `name` of group `group` travels as "group/name". Group names are checked to be non-empty
and free of "/", and a key splits at its *first* "/", so any parameter name (even one holding "/" or
".") comes back as it went. Tensors that several owners keep side by side (HFPL's memory per edge or
per client) are typed containers keyed by id, packed into one group by `pack` and read back by `unpack`.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, TypeVar

import torch
from pydantic import BaseModel

from fl_services.shared.core import tensors as leaf
from fl_services.shared.core.tensors import InvalidContent, M, PayloadError, Tensors, TensorSpec

Record = dict[str, Tensors]
RecordSpec = dict[str, TensorSpec]
SEPARATOR = "/"
V = TypeVar("V")
C = TypeVar("C")


def flatten(record: Mapping[str, Mapping[str, V]]) -> dict[str, V]:
    """{"group/name": value}: a record's tensors (or a record spec's entries) under one flat key each."""
    flat: dict[str, V] = {}
    for group, members in record.items():
        if not group or SEPARATOR in group:
            raise ValueError(f"group name {group!r} must be non-empty and free of {SEPARATOR!r}")
        flat.update({f"{group}{SEPARATOR}{name}": value for name, value in members.items()})
    return flat


def unflatten(flat: Tensors) -> Record:
    """The record `flatten` made; a key without a group is refused (InvalidContent, HTTP 422)."""
    record: Record = {}
    for key, t in flat.items():
        group, sep, name = key.partition(SEPARATOR)
        if not group or not sep:
            raise InvalidContent(f"tensor {key!r} names no group (expected 'group{SEPARATOR}name')")
        record.setdefault(group, {})[name] = t
    return record


def encode(record: Mapping[str, Tensors], message: BaseModel | None = None) -> bytes:
    return leaf.encode(flatten(record), message)


def decode(blob: bytes, message_type: type[M]) -> tuple[Record, M]:
    """A message whose tensors are a record; raises PayloadError on anything malformed."""
    flat, message = leaf.decode(blob, message_type)
    return unflatten(flat), message


def layout(blob: bytes) -> Record:
    """A stored or received record's tensors as shapes and dtypes only (meta tensors): its header alone."""
    return unflatten(leaf.layout(blob))


def decode_state(blob: bytes) -> Record:
    """A stored record without a header (edge or cloud state)."""
    return unflatten(leaf.decode_tensors(blob))


def spec_of(record: Record) -> RecordSpec:
    return {group: leaf.spec_of(members) for group, members in record.items()}


def check(record: Record, expected: RecordSpec, max_abs: float | None = None) -> None:
    """Groups, names, shapes, dtypes as expected and every value finite (and within ±`max_abs` where given), or
    InvalidContent says which."""
    leaf.check_tensors(flatten(record), flatten(expected), max_abs)


def non_finite(record: Record) -> list[str]:
    """The flattened names of the record's floating tensors that hold a NaN or an infinity, sorted."""
    return sorted(n for n, t in flatten(record).items() if t.is_floating_point() and not bool(t.isfinite().all()))


def check_magnitude(record: Record, bound: float = leaf.MAX_ABS,
                    members: Mapping[str, tuple[str, ...]] | None = None) -> None:
    """Every floating value of the record (or of only the named members of its groups) within ±bound."""
    chosen = record if members is None else {g: {n: record[g][n] for n in names} for g, names in members.items()}
    leaf.check_magnitude(flatten(chosen), bound)


# ---- typed containers keyed by id --------------------------------------------------------------
_IDS, _ROWS = "ids", "rows"


def pack(items: Mapping[int, Any]) -> Tensors:
    """Containers keyed by id (dataclasses whose fields are tensors of ≥ 1 dimension) as one group:
    "ids" (n,) int64 in ascending order, each field's tensors concatenated along dim 0 in that order, and
    "rows" (n, fields) int64, each container's length along dim 0 per field (fields may vary in length)."""
    if not items:
        return {}
    ids = sorted(items)
    fields = [f.name for f in dataclasses.fields(items[ids[0]])]
    if _IDS in fields or _ROWS in fields:
        raise ValueError(f"container fields may not be named {_IDS!r} or {_ROWS!r}")
    group = {name: torch.cat([getattr(items[i], name) for i in ids]).contiguous() for name in fields}
    group[_IDS] = torch.tensor(ids, dtype=torch.int64)
    group[_ROWS] = torch.tensor([[len(getattr(items[i], name)) for name in fields] for i in ids], dtype=torch.int64)
    return group


def unpack(group: Tensors, container: type[C]) -> dict[int, C]:
    """The containers `pack` wrote, by id; an empty or absent group is no container."""
    if not group:
        return {}
    fields = [f.name for f in dataclasses.fields(container)]  # type: ignore[arg-type]
    if group.keys() != {*fields, _IDS, _ROWS}:
        raise PayloadError(f"packed {container.__name__} has tensors {sorted(group)}, expected {fields}")
    rows = group[_ROWS].tolist()
    parts = {name: torch.split(group[name], [r[j] for r in rows]) for j, name in enumerate(fields)}
    return {int(i): container(**{name: parts[name][n] for name in fields})
            for n, i in enumerate(group[_IDS].tolist())}
