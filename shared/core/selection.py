"""Which clients train in a round: m = max(⌊λ·N⌋, 1) of them, drawn by a generator that belongs to
(seed, round, edge), so the edge service and the reference runner pick the same ones."""
from __future__ import annotations

import math

from fl_services.shared.core.config import RunConfig
from fl_services.shared.core.seeding import SELECTION, numpy_generator


def num_selected(fraction: float, num_clients: int) -> int:
    """m = max(floor(λ·N), 1)."""
    return max(math.floor(fraction * num_clients + 1e-9), 1)


def select_clients(config: RunConfig, client_ids: list[int], round: int, edge_id: int) -> list[int]:
    """The m clients an edge trains in `round`, drawn from a generator owned by (seed, round, edge)."""
    pool = sorted(client_ids)
    m = num_selected(config.fraction, len(pool))
    rng = numpy_generator(config.seed, SELECTION, round, edge_id)
    return sorted(pool[i] for i in rng.choice(len(pool), size=m, replace=False))
