"""Aggregation maths as plain functions over name -> tensor dicts.

An edge reduces its clients to a `Partial` (weighted sums and their total weight). Partials are
associative: combining the partials of several edges equals reducing all their clients at once, so
the flat case (one edge) and hierarchical averaging are one code path.
Sums accumulate in float64 so that the grouping of clients into edges barely moves the result.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import torch

from shared.transport.tensors import Tensors


@dataclass(frozen=True)
class Partial:
    sums: Tensors  # float64: sum_k weight_k * x_k
    weight: float  # sum_k weight_k


def reduce(items: Iterable[tuple[float, Tensors]]) -> Partial:
    sums: Tensors = {}
    total = 0.0
    for weight, tensors in items:
        total += weight
        for name, t in tensors.items():
            term = t.to(torch.float64) * weight
            sums[name] = sums[name] + term if name in sums else term
    if total <= 0:
        raise ValueError("cannot reduce an empty or zero-weight set")
    return Partial(sums, total)


def combine(partials: Iterable[Partial]) -> Partial:
    partials = list(partials)
    if not partials:
        raise ValueError("no partials to combine")
    sums = {name: torch.stack([p.sums[name] for p in partials]).sum(0) for name in partials[0].sums}
    return Partial(sums, sum(p.weight for p in partials))


def mean(partial: Partial) -> Tensors:
    """The weighted mean, still float64: the caller casts when it applies the step."""
    return {name: s / partial.weight for name, s in partial.sums.items()}


def add_scaled(base: Tensors, step: Tensors, scale: float) -> Tensors:
    """base + scale * step, computed in float64 and returned in base's dtypes."""
    return {
        name: (t.to(torch.float64) + scale * step[name].to(torch.float64)).to(t.dtype) if name in step else t
        for name, t in base.items()
    }
