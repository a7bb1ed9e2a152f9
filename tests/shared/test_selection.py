"""Client selection: m = max(⌊λN⌋, 1), seeded per (seed, round, edge)."""
import pytest

from fl_services.shared.core.config import RunConfig
from fl_services.shared.core.selection import num_selected, select_clients


@pytest.mark.parametrize("fraction, n, m", [(1.0, 10, 10), (0.25, 20, 5), (0.1, 9, 1), (0.01, 5, 1), (0.3, 10, 3)])
def test_m_is_max_floor_lambda_n_and_1(fraction, n, m):
    assert num_selected(fraction, n) == m


def test_selection_is_seeded_per_round_and_edge():
    config = RunConfig(fraction=0.3, data={"dataset": "digits", "num_clients": 10}, model={"name": "logreg"})
    ids = list(range(10))
    picks = [select_clients(config, ids, r, 0) for r in range(6)]
    assert picks == [select_clients(config, ids, r, 0) for r in range(6)]
    assert all(len(p) == 3 and p == sorted(set(p)) for p in picks)
    assert len({tuple(p) for p in picks}) > 1  # rounds differ
    other_seed = config.model_copy(update={"seed": 5})
    assert [select_clients(other_seed, ids, r, 0) for r in range(6)] != picks
    assert select_clients(config, list(reversed(ids)), 0, 0) == picks[0]  # order of registration is irrelevant
