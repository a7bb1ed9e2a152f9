"""Model steps as fixed-point integers modulo 2^bits, so that masks cancel exactly in the sum.

A device encodes its step Δ (each coordinate clipped to ±clip) as q = round(Δ·2^f) and sends w·q mod 2^bits,
w its integer weight (its sample count, or 1 with uniform weighting). The aggregator's sum Σ w_k q_k is then
decoded as a two's-complement integer and divided by 2^f: Σ w_k Δ_k with an error of at most W·2^-(f+1) per
coordinate (W = Σ w_k), so the weighted mean errs by at most 2^-(f+1). The sum fits while
W·clip·2^f < 2^(bits-1): `check_capacity` refuses a round that would wrap."""
from __future__ import annotations

import numpy as np
import torch

from fl_services.shared.core import records
from fl_services.shared.core.records import Record, RecordSpec

RecordLayout = list[tuple[str, str, tuple[int, ...]]]  # (group, name, shape) in sorted order


class CapacityExceeded(ValueError):
    """The weighted sum could wrap around the ring: more bits (or a smaller clip or scale) are needed."""


def ring_mask(bits: int) -> np.uint64:
    return np.uint64((1 << bits) - 1) if bits < 64 else np.uint64(0xFFFF_FFFF_FFFF_FFFF)


def layout(spec: RecordSpec) -> RecordLayout:
    """A record's tensors (by their spec, records.spec_of) in a fixed order, sorted by group and name: a decoded
    record lists them in another order than the model that made it."""
    return [(group, name, tuple(int(d) for d in spec[group][name][0]))  # type: ignore[arg-type]
            for group in sorted(spec) for name in sorted(spec[group])]


def length(spec: RecordLayout) -> int:
    return sum(int(np.prod(shape, dtype=np.int64)) for _, _, shape in spec)


def check_capacity(total_weight: int, clip: float, scale_bits: int, bits: int) -> None:
    if total_weight * clip * 2.0**scale_bits >= 2.0 ** (bits - 1):
        raise CapacityExceeded(
            f"a weighted sum of total weight {total_weight} with values up to {clip} at 2^{scale_bits} could wrap "
            f"modulo 2^{bits}: raise secure_aggregation.bits or lower clip or scale_bits")


def encode(record: Record, weight: int, clip: float, scale_bits: int, bits: int) -> np.ndarray:
    """`weight`·round(clip(Δ)·2^f) mod 2^bits, as one flat uint64 vector in `layout` order."""
    parts = []
    for group, name, _ in layout(records.spec_of(record)):
        values = record[group][name].detach().to(torch.float64).reshape(-1).numpy()
        q = np.rint(np.clip(values, -clip, clip) * 2.0**scale_bits).astype(np.int64)
        parts.append(q)
    flat = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
    # Two's complement: a negative int64 viewed as uint64 is its residue modulo 2^64, hence modulo 2^bits.
    return (flat.view(np.uint64) * np.uint64(weight)) & ring_mask(bits)


def decode(total: np.ndarray, spec: RecordLayout, scale_bits: int, bits: int) -> Record:
    """The ring sum back as float64 sums Σ w_k Δ_k, shaped by `spec`."""
    value = total.astype(np.uint64) & ring_mask(bits)
    if bits < 64:  # sign-extend from bit bits-1
        half = np.uint64(1 << (bits - 1))
        signed = value.astype(np.int64) - ((value & half) != 0).astype(np.int64) * (1 << bits)
    else:
        signed = value.view(np.int64)
    floats = signed.astype(np.float64) / 2.0**scale_bits
    out: Record = {}
    offset = 0
    for group, name, shape in spec:
        n = int(np.prod(shape, dtype=np.int64))
        out.setdefault(group, {})[name] = torch.from_numpy(floats[offset:offset + n].copy()).reshape(shape)
        offset += n
    return out
