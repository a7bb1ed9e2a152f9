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

from shared.transport.records import Record
from shared.transport.tensors import Tensors


@dataclass(frozen=True)
class Partial:
    sums: Record  # float64: sum_k weight_k * x_k, group by group
    weight: float  # sum_k weight_k


def reduce(items: Iterable[tuple[float, Record]]) -> Partial:
    sums: Record = {}
    total = 0.0
    for weight, record in items:
        total += weight
        for group, tensors in record.items():
            into = sums.setdefault(group, {})
            for name, t in tensors.items():
                term = t.to(torch.float64) * weight
                into[name] = into[name] + term if name in into else term
    if total <= 0:
        raise ValueError("cannot reduce an empty or zero-weight set")
    return Partial(sums, total)


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
