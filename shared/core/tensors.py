"""Tensors on the wire: one safetensors blob carries the tensors and a typed JSON header.

The header lives in the safetensors `__metadata__` under "message", so a request body is a single
binary document: no JSON float lists, and nothing is ever unpickled.
"""
from __future__ import annotations

import json
import math
import struct
import threading
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
from pydantic import BaseModel, ValidationError
from safetensors import SafetensorError
from safetensors.numpy import save as st_save_numpy
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

Tensors = dict[str, torch.Tensor]
M = TypeVar("M", bound=BaseModel)

_MESSAGE_KEY = "message"


class PayloadError(ValueError):
    """The bytes are not a well-formed message (HTTP 400)."""


class InvalidContent(PayloadError):
    """Well-formed bytes whose header or tensors break the contract (HTTP 422)."""


# The dtypes safetensors' numpy writer takes: it writes the same bytes as its torch writer at about a quarter of
# the cost (a CNN's 10 tensors: 0.2 against 0.75 ms, most of a small task's encoding); torch's writes the others
# (bfloat16, float8) and tensors off the CPU.
_NUMPY_DTYPES = frozenset({torch.float64, torch.float32, torch.float16, torch.int64, torch.int32, torch.int16,
                           torch.int8, torch.uint8, torch.bool})


def encode(tensors: Tensors, message: BaseModel | None = None) -> bytes:
    metadata = {_MESSAGE_KEY: message.model_dump_json()} if message is not None else None
    # safetensors refuses non-contiguous or shared storage; detach+contiguous copies only when needed.
    plain = {k: v.detach().contiguous() for k, v in tensors.items()}
    if all(v.dtype in _NUMPY_DTYPES and v.device.type == "cpu" for v in plain.values()):
        return st_save_numpy({k: v.numpy() for k, v in plain.items()}, metadata=metadata)
    return st_save(plain, metadata=metadata)


class SharedEncoding:
    """Tensors serialised once, sent under many headers: a round's global state goes to every client of the
    edge with only its task header differing. Encoding it per task cost the edge one copy of the model per
    client (1,000 encodes of the same bytes a round); here the tensors are encoded on first use, from any
    thread, and each message is its header spliced before the shared bytes."""

    def __init__(self, tensors: Tensors):
        self._tensors: Tensors | None = tensors
        self._lock = threading.Lock()
        self._index = "}"  # the JSON header's tensor entries, without its opening brace
        self._data = b""

    def blob(self, message: BaseModel) -> bytes:
        """The same document `encode(tensors, message)` makes (its JSON header may be laid out differently)."""
        return b"".join(self.parts(message))

    def parts(self, message: BaseModel) -> tuple[bytes, bytes]:
        """The document as its head (length and JSON header, with the message) and its data: the data is the
        same bytes object for every message."""
        with self._lock:
            if self._tensors is not None:
                plain = encode(self._tensors)
                (length,) = struct.unpack("<Q", plain[:8])
                index = json.loads(plain[8 : 8 + length])
                index.pop("__metadata__", None)
                # The tensors' entries as JSON once: each message only prepends its metadata to them.
                self._index = json.dumps(index, separators=(",", ":"))[1:]
                self._data, self._tensors = plain[8 + length :], None  # the tensors are no longer needed
        metadata = json.dumps({"__metadata__": {_MESSAGE_KEY: message.model_dump_json()}}, separators=(",", ":"))
        header = (metadata[:-1] + ("," + self._index if self._index != "}" else "}")).encode()
        header += b" " * (-len(header) % 8)  # safetensors aligns the data at 8 bytes, as its writer does
        return struct.pack("<Q", len(header)) + header, self._data


def _header(blob: bytes) -> dict[str, Any]:
    """The safetensors header: every tensor's dtype, shape and offsets, and `__metadata__`."""
    if len(blob) < 8:
        raise PayloadError("body is not a safetensors document (too short)")
    (header_len,) = struct.unpack("<Q", blob[:8])
    if header_len > len(blob) - 8:
        raise PayloadError("safetensors header length exceeds the body")
    try:
        header = json.loads(blob[8 : 8 + header_len], object_pairs_hook=_unique_keys)
    except ValueError as exc:  # not UTF-8, not JSON, a key twice, an integer over Python's 4,300 digits...
        raise PayloadError(f"safetensors header is not JSON: {str(exc)[:200]}") from exc
    except RecursionError as exc:  # e.g. [[[[...]]]] nested 100,000 deep
        raise PayloadError("safetensors header is nested too deeply") from exc
    if not isinstance(header, dict):
        raise PayloadError("safetensors header is not a JSON object")
    return header


def _metadata(blob: bytes) -> dict[str, str]:
    meta = _header(blob).get("__metadata__") or {}
    if not isinstance(meta, dict):
        raise PayloadError("safetensors __metadata__ is not an object")
    return meta


class _DuplicateKey(ValueError):
    pass


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """json.loads keeps the last of two equal keys; a tensor named twice would then be silently dropped."""
    counts = Counter(k for k, _ in pairs)
    if len(counts) != len(pairs):
        repeated = sorted(k for k, n in counts.items() if n > 1)
        raise _DuplicateKey(f"duplicate keys {repeated[:5]}{' …' if len(repeated) > 5 else ''}")
    return dict(pairs)


def decode(blob: bytes, message_type: type[M]) -> tuple[Tensors, M]:
    """Parses a message; raises PayloadError on anything malformed."""
    message = message_of(blob, message_type)
    return decode_tensors(blob), message


def message_of(blob: bytes, message_type: type[M]) -> M:
    """A message's header alone, its tensors left unread."""
    meta = _metadata(blob)
    if _MESSAGE_KEY not in meta:
        raise PayloadError("safetensors metadata has no 'message' header")
    try:
        return message_type.model_validate_json(meta[_MESSAGE_KEY])
    except ValidationError as exc:
        # Without the input: the header may be megabytes, and the 422 must not echo it.
        errors = exc.errors(include_url=False, include_input=False)
        raise InvalidContent(f"invalid {message_type.__name__}: {errors}") from exc


def decode_tensors(blob: bytes) -> Tensors:
    try:
        return st_load(blob)
    except (SafetensorError, ValueError, RuntimeError) as exc:
        raise PayloadError(f"malformed safetensors: {exc}") from exc
    except KeyError as exc:  # a dtype this torch has no type for, e.g. F4 or F8_E8M0
        raise PayloadError(f"unsupported safetensors dtype {exc}") from exc


# safetensors' dtype names (those torch has).
_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
           "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
           "BOOL": torch.bool}


def layout(blob: bytes) -> Tensors:
    """The tensors of a safetensors document as shapes and dtypes only (tensors on the "meta" device), read
    from its header alone: what a check of another message against this one needs, without copying data."""
    try:
        return {name: torch.empty(entry["shape"], dtype=_DTYPES[entry["dtype"]], device="meta")
                for name, entry in _header(blob).items() if name != "__metadata__"}
    except (KeyError, TypeError, ValueError, RuntimeError) as exc:
        raise PayloadError(f"malformed safetensors header: {exc}") from exc


@dataclass(frozen=True)
class Dim:
    """A named dimension of variable size (0..max): every tensor using the name must agree on it.

    E.g. features (Dim("n", 200), 64) and labels (Dim("n", 200),): up to 200 rows, as many labels.
    """

    name: str
    max: int


TensorSpec = dict[str, tuple[tuple["int | Dim", ...], torch.dtype]]


def spec_of(tensors: Tensors) -> TensorSpec:
    return {k: (tuple(v.shape), v.dtype) for k, v in tensors.items()}


def check_tensors(tensors: Tensors, expected: TensorSpec, max_abs: float | None = None) -> None:
    """Names, shapes, dtypes must match exactly and every value be finite (and within ±`max_abs` where given: what
    `check_magnitude` checks, read in the same pass), or InvalidContent says which."""
    missing = sorted(expected.keys() - tensors.keys())
    extra = sorted(tensors.keys() - expected.keys())
    if missing or extra:
        raise InvalidContent(f"tensor names differ: missing {missing}, unexpected {extra}")
    bound: dict[str, int] = {}
    for name, (shape, dtype) in expected.items():
        t = tensors[name]
        if not _shape_matches(tuple(t.shape), shape, bound):
            raise InvalidContent(f"tensor {name!r} has shape {list(t.shape)}, expected {_show(shape, bound)}")
        if t.dtype != dtype:
            raise InvalidContent(f"tensor {name!r} has dtype {t.dtype}, expected {dtype}")
    extremes = _extremes_of_all(tensors.values())
    if all(map(math.isfinite, extremes)) and (max_abs is None or max(map(abs, extremes)) <= max_abs):
        return
    for name in expected:  # which one: read again only for a refusal
        t = tensors[name]
        if t.is_floating_point() and t.numel() and not all(map(math.isfinite, _extremes(t))):
            raise InvalidContent(f"tensor {name!r} contains NaN or Inf")
    if max_abs is not None:
        check_magnitude(tensors, max_abs)


# Far beyond any weight, update, prototype or feature a sane run produces. A finite 1e300 passes the
# NaN check, then overflows float32 in the global model (or in a client's ‖f − C̄‖²) and ruins the run.
MAX_ABS = 1e6


def check_magnitude(tensors: Tensors, bound: float = MAX_ABS, names: Iterable[str] | None = None) -> None:
    """Every floating value of the named tensors (all by default) lies within ±bound, or InvalidContent."""
    chosen = list(tensors if names is None else names)
    if max(map(abs, _extremes_of_all(tensors[name] for name in chosen))) <= bound:
        return
    for name in chosen:  # which one, read again tensor by tensor (a NaN passes here: check_tensors refuses it)
        t = tensors[name]
        if t.is_floating_point() and t.numel() and max(abs(x) for x in _extremes(t)) > bound:
            raise InvalidContent(f"tensor {name!r} has values beyond ±{bound:g}")


# Below this many values in all, a result's floating tensors are read as one: copied into one tensor and
# reduced once, where each tensor's own reduction cost more in call overhead than in reading (a CNN's
# update of 10 tensors and 44k values, checked twice, was 20 reductions for every result an edge took).
_JOINED_MAX = 1 << 20


def _extremes_of_all(tensors: Iterable[torch.Tensor]) -> tuple[float, float]:
    """(min, max) over every value of the floating tensors among `tensors`, NaN if one holds a NaN; (0, 0) if
    they hold no value. Small tensors are joined into one reduction, the others reduced one by one."""
    floats = [t for t in tensors if t.is_floating_point() and t.numel()]
    small = [t.reshape(-1) for t in floats if t.numel() < _JOINED_MAX]
    parts = [_extremes(t) for t in floats if t.numel() >= _JOINED_MAX]
    if small:
        parts.append(_extremes(torch.cat(small) if len(small) > 1 else small[0]))
    if not parts:
        return 0.0, 0.0
    lows, highs = zip(*parts, strict=True)
    # min/max of Python floats drop a NaN depending on its position: carried explicitly.
    if any(math.isnan(x) for x in (*lows, *highs)):
        return math.nan, math.nan
    return min(lows), max(highs)


def _extremes(t: torch.Tensor) -> tuple[float, float]:
    """(min, max) of a non-empty floating tensor, NaN if it holds one: one pass, no temporary tensor (where
    isfinite and abs allocated one of the tensor's size each, which for a 60 MB contribution took longer
    than reading it)."""
    low, high = torch.aminmax(t)
    return float(low), float(high)


def _shape_matches(actual: tuple[int, ...], expected: tuple[int | Dim, ...], bound: dict[str, int]) -> bool:
    if len(actual) != len(expected):
        return False
    for size, want in zip(actual, expected, strict=True):
        if isinstance(want, Dim):
            if size > want.max or bound.setdefault(want.name, size) != size:
                return False
        elif size != want:
            return False
    return True


def _show(shape: tuple[int | Dim, ...], bound: dict[str, int]) -> list[str | int]:
    return [f"{d.name}={bound[d.name]}" if isinstance(d, Dim) and d.name in bound
            else f"{d.name}<={d.max}" if isinstance(d, Dim) else d for d in shape]
