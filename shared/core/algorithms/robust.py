"""Byzantine-robust aggregation and DP-FedAvg's clipping, as plain functions over records.

The mean of shared/core/algorithms/aggregate.py is associative: an edge can fold each update into a running
sum and forget it. These are not: each needs every update at once (n of them, each a whole model), so an
edge that uses them keeps its clients' updates until the round ends, and the cloud its buffer.

- coordinate-wise median and trimmed mean (Yin et al., ICML 2018): per coordinate, the median of the n
  values, or the mean after dropping the ⌊β·n⌋ largest and smallest;
- (multi-)Krum (Blanchard et al., NeurIPS 2017): each update is scored by the sum of squared distances to
  its n − f − 2 nearest others; the m best-scored are averaged (m = 1: Krum);

Every update counts once: weighting by the sample counts clients claim would let one device take a round
over by claiming a huge count. Results are float64, like the mean's sums; inputs are taken in the order given (the
callers sort by client or edge id), and every reduction is deterministic.
"""
from __future__ import annotations

import math

import torch

from fl_services.shared.core.config import AggregationConfig, RunConfig
from fl_services.shared.core.records import Record
from fl_services.shared.core.selection import num_selected


def _stacked(updates: list[Record]) -> dict[str, dict[str, torch.Tensor]]:
    """group -> name -> an (n, *shape) float64 stack of the updates' tensors."""
    if not updates:
        raise ValueError("no updates to aggregate")
    return {group: {name: torch.stack([u[group][name].to(torch.float64) for u in updates])
                    for name in tensors}
            for group, tensors in updates[0].items()}


def aggregate(name: str, config: AggregationConfig, updates: list[Record]) -> Record:
    """The step the aggregator `name` ("median", "trimmed_mean" or "krum") makes of `updates`, with the
    parameters of `config`."""
    if name == "median":
        return median(updates)
    if name == "trimmed_mean":
        return trimmed_mean(updates, config.trim_fraction)
    if name == "krum":
        return krum(updates, config.krum_byzantine, config.krum_selected)
    raise ValueError(f"{name!r} is not a robust aggregator")


def median(updates: list[Record]) -> Record:
    """Coordinate-wise median; with an even count, the mean of the two middle values (torch.median would
    take the lower one, biasing every coordinate down)."""
    n = len(updates)
    out: Record = {}
    for group, tensors in _stacked(updates).items():
        out[group] = {}
        for name, stack in tensors.items():
            ordered = stack.sort(dim=0).values
            out[group][name] = ordered[n // 2] if n % 2 else (ordered[n // 2 - 1] + ordered[n // 2]) / 2
    return out


def trimmed_mean(updates: list[Record], beta: float) -> Record:
    """Coordinate-wise mean of the values left after dropping the ⌊β·n⌋ largest and ⌊β·n⌋ smallest."""
    if not 0 <= beta < 0.5:
        raise ValueError(f"trimmed mean needs 0 ≤ β < 0.5, got {beta}")
    n = len(updates)
    k = math.floor(beta * n)
    return {group: {name: stack.sort(dim=0).values[k:n - k].mean(dim=0) for name, stack in tensors.items()}
            for group, tensors in _stacked(updates).items()}


def krum_scores(updates: list[Record], f: int) -> torch.Tensor:
    """Each update's Krum score: the sum of its squared distances to its n − f − 2 nearest other updates."""
    n = len(updates)
    flat = torch.stack([torch.cat([t.to(torch.float64).reshape(-1) for g in sorted(u) for _, t in sorted(u[g].items())])
                        for u in updates])
    # Pairwise squared distances through one matrix product (‖a‖² + ‖b‖² − 2a·b, float64): 100 CNN updates took
    # 650 s as n row-by-row differences on a loaded machine; the rounding it adds is far below any real gap.
    distances = (torch.cdist(flat, flat, compute_mode="use_mm_for_euclid_dist") ** 2).fill_diagonal_(0)
    neighbours = max(n - f - 2, 0)
    # Each row sorted: its first entry is the update itself (distance 0), then its nearest others.
    return distances.sort(dim=1).values[:, 1:1 + neighbours].sum(dim=1)


def krum(updates: list[Record], f: int, m: int = 1) -> Record:
    """Multi-Krum: the mean of the m updates with the lowest scores (ties: the earlier update).

    Krum's guarantee needs n ≥ 2f + 3; with fewer updates (stragglers), f is lowered to what n allows,
    ⌊(n − 3)/2⌋, rather than fail the round; n ≤ 2 leaves no neighbour to score by: their mean."""
    n = len(updates)
    if n <= 2:
        return _mean(updates, range(n))
    f = min(f, (n - 3) // 2)
    scores = krum_scores(updates, f)
    chosen = sorted(range(n), key=lambda i: (float(scores[i]), i))[:min(m, n - f)]
    return _mean(updates, sorted(chosen))


def _mean(updates: list[Record], indices: range | list[int]) -> Record:
    picked = [updates[i] for i in indices]
    return {group: {name: stack.mean(dim=0) for name, stack in tensors.items()}
            for group, tensors in _stacked(picked).items()}


def check(config: RunConfig) -> None:
    """Raises ValueError for aggregators that cannot do their job with the updates a round brings: each edge's
    selected clients (edge level) or the buffer's B contributions (cloud level). In a run over registered devices an
    edge's count is known only round by round: its aggregator takes the updates it gets, as with stragglers (Krum
    lowers f, the median of two is their mean, a trimmed mean with ⌊β·n⌋ = 0 trims nothing)."""
    agg = config.aggregation
    levels = [("cloud", agg.cloud, config.topology.buffer_size)]
    if config.selection is None:
        per_edge = min(num_selected(config.fraction, len(config.clients_of_edge(e)))
                       for e in range(config.topology.num_edges))
        levels.insert(0, ("edge", agg.edge, per_edge))
    for level, name, n in levels:
        what = f"aggregation.{level} {name!r} over {n} update{'s' if n != 1 else ''}"
        if name == "median" and n < 3:
            raise ValueError(f"{what}: the median of fewer than 3 values is their mean")
        if name == "trimmed_mean" and math.floor(agg.trim_fraction * n) == 0:
            raise ValueError(f"{what}: floor(trim_fraction * n) = 0 trims nothing; raise "
                             f"aggregation.trim_fraction to at least 1/{n}")
        if name == "krum" and n < 2 * agg.krum_byzantine + 3:
            raise ValueError(f"{what}: krum needs at least 2f + 3 = {2 * agg.krum_byzantine + 3} updates "
                             f"(f = aggregation.krum_byzantine)")
        if name == "krum" and agg.krum_selected > n - agg.krum_byzantine:
            raise ValueError(f"{what}: multi-Krum averages at most n - f = {n - agg.krum_byzantine} updates "
                             f"(aggregation.krum_selected)")
