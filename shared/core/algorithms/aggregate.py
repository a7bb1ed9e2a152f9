"""Aggregation maths as plain functions over records (group -> name -> tensor).

An edge reduces its clients to a `Partial` (weighted sums and their total weight). Partials are
associative: combining the partials of several edges equals reducing all their clients at once, so
the flat case (one edge) and hierarchical averaging are one code path.
Sums accumulate in float64 so that the grouping of clients into edges barely moves the result.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import torch

from fl_services.shared.core.algorithms import fused
from fl_services.shared.core.records import Record
from fl_services.shared.core.tensors import Tensors


@dataclass(frozen=True)
class Partial:
    sums: Record  # float64: sum_k weight_k * x_k, group by group
    weight: float  # sum_k weight_k


# Elements per step of the in-place accumulate: a float64 chunk of the sum and its scratch, 512 KiB each, stay in
# the core's cache while every client's values are added to them.
_CHUNK = 65_536


def reduce(items: Iterable[tuple[float, Record]]) -> Partial:
    """Σ weight·x in float64, in place, a cache-sized chunk of the sum at a time with every client added to it
    in their order: per element the same three roundings, in the same order, as `sum + x.double() * weight`
    client after client (cast, multiply, add; never a fused multiply-add), so bit-identical to it. Neither
    two new float64 tensors per client and name (a twentieth of a plain copy's speed) nor a pass over the
    whole float64 sum per client (twice the bytes of the update itself): what crosses memory is each
    update, read once."""
    terms: dict[str, dict[str, list[tuple[float, torch.Tensor]]]] = {}
    total = 0.0
    for weight, record in items:
        total += weight
        for group, tensors in record.items():
            named = terms.setdefault(group, {})
            for name, t in tensors.items():
                named.setdefault(name, []).append((weight, t))
    if total <= 0:
        raise ValueError("cannot reduce an empty or zero-weight set")
    scratch = torch.empty(_CHUNK, dtype=torch.float64)
    sums: Record = {}
    for group, by_name in terms.items():
        sums[group] = {}
        for name, ((weight, t), *rest) in by_name.items():
            # `.to` keeps a transpose's strides; the first term starts the sum, as `0 + x·w` would.
            into = sums[group][name] = (t.to(torch.float64) * weight).contiguous()
            flat = [(w, x.reshape(-1)) for w, x in rest]
            for _, x in flat:
                if x.numel() != into.numel():
                    raise ValueError(f"cannot add a tensor of {x.numel()} elements to a sum of {into.numel()}")
            _accumulate(into.view(-1), flat, scratch)
    return Partial(sums, total)


def _accumulate(into: torch.Tensor, terms: list[tuple[float, torch.Tensor]], scratch: torch.Tensor) -> None:
    """into += x.double() * weight for every (weight, x) in order, in place, all flat: chunk by chunk. Through the
    fused kernel (`fused.py`: numba installed, float32 terms on the CPU, a sum large enough), else torch's ops; the
    two are bit-identical."""
    kernel = fused.kernels() if into.numel() >= fused.MIN_ELEMENTS and into.is_cpu else None
    if kernel is not None and all(x.dtype == torch.float32 and x.is_cpu for _, x in terms):
        fused.accumulate(kernel, into.detach().numpy(), [(float(w), x.detach().contiguous().numpy()) for w, x in terms],
                         _CHUNK)
        return
    for start in range(0, into.numel(), _CHUNK):
        chunk = into[start : start + _CHUNK]
        term = scratch[: chunk.numel()]
        for weight, x in terms:
            chunk.add_(term.copy_(x[start : start + _CHUNK]).mul_(weight))


def combine(partials: Iterable[Partial]) -> Partial:
    partials = list(partials)
    if not partials:
        raise ValueError("no partials to combine")
    sums = {group: {name: torch.stack([p.sums[group][name] for p in partials]).sum(0) for name in tensors}
            for group, tensors in partials[0].sums.items()}
    return Partial(sums, sum(p.weight for p in partials))


def mean(partial: Partial) -> Record:
    """The weighted mean, still float64: the caller casts when it applies the step."""
    return {group: {name: s / partial.weight for name, s in tensors.items()} for group, tensors in partial.sums.items()}


def add_scaled(base: Tensors, step: Tensors, scale: float) -> Tensors:
    """base + scale * step, computed in float64 and returned in base's dtypes."""
    return {
        name: (t.to(torch.float64) + scale * step[name].to(torch.float64)).to(t.dtype) if name in step else t
        for name, t in base.items()
    }
