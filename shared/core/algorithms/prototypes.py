"""Incremental prototype means: the maths of EdgeAggregate and CloudUpdate, as plain functions.

Both keep, per class j, a running mean over contributors and replace a contributor's previous value
when it contributes again, so neither needs more than the latest value of each contributor:

    edge:  C_j^l  = mean over clients i that ever had class j of their latest c_{i,j}
    cloud: C̄_j   = Σ_l N_j^l·C_j^l / Σ_l N_j^l over the latest (C^l, N^l) of every edge

Prototype tensors are (J, d) float64 with a (J,) mask or count beside them; float64 because the
updates add and subtract the same vectors over hundreds of rounds.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class ClientPrototypes:
    """c_i: a client's class means; `present[j]` says whether it has class j."""

    means: torch.Tensor  # (J, d) float64
    present: torch.Tensor  # (J,) bool


@dataclass(frozen=True)
class EdgePrototypes:
    """(C^l, N^l): the edge's class means and, per class, how many distinct clients are behind them."""

    means: torch.Tensor  # (J, d) float64
    counts: torch.Tensor  # (J,) float64, whole numbers


def empty(num_classes: int, dim: int) -> EdgePrototypes:
    return EdgePrototypes(torch.zeros(num_classes, dim, dtype=torch.float64),
                          torch.zeros(num_classes, dtype=torch.float64))


def _divide(sums: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    safe = torch.where(counts > 0, counts, torch.ones_like(counts))
    return torch.where((counts > 0)[:, None], sums / safe[:, None], torch.zeros_like(sums))


def edge_aggregate_prototypes(
    current: EdgePrototypes, previous: dict[int, ClientPrototypes], updates: dict[int, ClientPrototypes]
) -> tuple[EdgePrototypes, dict[int, ClientPrototypes]]:
    """EdgeAggregate's prototype part. `previous` holds c_i^{l,prev} of every client ever aggregated.

    Ĉ_j = N_j·C_j; for each client i in S^l with class j: Ĉ_j += c_{i,j}, then Ĉ_j −= c_{i,j}^{prev}
    if it exists, else N_j += 1; C_j = Ĉ_j / N_j. Returns the new (C^l, N^l) and c^{prev} ← c_i.
    """
    sums = current.counts[:, None] * current.means
    counts = current.counts.clone()
    previous = dict(previous)
    for i in sorted(updates):
        c = updates[i]
        prev = previous.get(i)
        sums[c.present] += c.means[c.present]
        if prev is None:
            counts += c.present.to(counts.dtype)
            previous[i] = c
            continue
        again = c.present & prev.present
        sums[again] -= prev.means[again]
        counts += (c.present & ~prev.present).to(counts.dtype)
        # A class the client no longer reports keeps its last prototype: the mean stays over latest values.
        previous[i] = ClientPrototypes(torch.where(c.present[:, None], c.means, prev.means), c.present | prev.present)
    return EdgePrototypes(_divide(sums, counts), counts), previous


def cloud_update_prototypes(
    global_means: torch.Tensor, previous: dict[int, EdgePrototypes], buffer: dict[int, EdgePrototypes]
) -> tuple[torch.Tensor, torch.Tensor, dict[int, EdgePrototypes]]:
    """CloudUpdate's prototype part. `previous` holds (C^{l,prev}, N^{l,prev}) of every edge seen.

    Ĉ_j = Σ_l N_j^{l,prev}·C̄_j; for each (C^l, N^l) in the buffer: Ĉ_j += N_j^l·C_j^l − N_j^{l,prev}·C_j^{l,prev}
    (the second term only if edge l contributed before), N^{l,prev} ← N^l, C^{l,prev} ← C^l;
    C̄_j = Ĉ_j / Σ_l N_j^{l,prev}. Returns C̄, Σ_l N^{l,prev} and the new previous values.
    """
    total = sum((e.counts for e in previous.values()), torch.zeros(global_means.shape[0], dtype=torch.float64))
    sums = total[:, None] * global_means
    previous = dict(previous)
    for edge in sorted(buffer):
        new = buffer[edge]
        sums += new.counts[:, None] * new.means
        old = previous.get(edge)
        if old is not None:
            sums -= old.counts[:, None] * old.means
            total = total - old.counts
        total = total + new.counts
        previous[edge] = new
    return _divide(sums, total), total, previous
