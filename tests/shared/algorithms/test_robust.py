"""Robust aggregators and DP-FedAvg's pieces: the maths against plain definitions, the accountant against
opacus's own RDPAccountant, and the ε budget through the reference runner.

scipy and opacus are imported in the tests that use them: every test worker collects this module (a second of
imports each), one of them runs those tests."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fl_services.shared.core.algorithms import privacy, registry, robust
from fl_services.shared.core.config import AggregationConfig, RunConfig
from fl_services.shared.core.data import load_federated
from fl_services.shared.core.reference import run_reference


def records(values: list[list[float]]) -> list[dict[str, dict[str, torch.Tensor]]]:
    """One record per row: {"model": {"w": the row's first two values, "b": the rest}}."""
    return [{"model": {"w": torch.tensor(v[:2], dtype=torch.float32), "b": torch.tensor(v[2:], dtype=torch.float32)}}
            for v in values]


def flat(record: dict[str, dict[str, torch.Tensor]]) -> list[float]:
    return [*record["model"]["w"].tolist(), *record["model"]["b"].tolist()]


ROWS = np.random.default_rng(0).normal(size=(7, 5)).round(3).tolist()


@pytest.mark.parametrize("n", [5, 6])
def test_median_is_numpys_median_coordinate_by_coordinate(n):
    rows = ROWS[:n]
    assert flat(robust.median(records(rows))) == pytest.approx(np.median(rows, axis=0).tolist(), abs=1e-6)


def test_trimmed_mean_is_scipys_trim_mean():
    from scipy import stats

    out = robust.trimmed_mean(records(ROWS), 0.2)  # ⌊0.2·7⌋ = 1 dropped at each end
    assert flat(out) == pytest.approx(stats.trim_mean(ROWS, 1 / 7 + 1e-9, axis=0).tolist(), abs=1e-6)
    assert flat(robust.trimmed_mean(records(ROWS), 0.0)) == pytest.approx(np.mean(ROWS, axis=0).tolist(), abs=1e-6)


def test_krum_scores_by_distance_to_its_nearest_neighbours():
    # Five honest updates near 0 and two far away: f = 1, so each is scored by its n − f − 2 = 4 nearest.
    honest = [[0.1 * i, 0, 0, 0, 0] for i in range(5)]
    rows = honest + [[100, 100, 0, 0, 0], [-50, 80, 0, 0, 0]]
    scores = robust.krum_scores(records(rows), f=1)
    expected = []
    for row in rows:
        d = sorted(sum((a - b) ** 2 for a, b in zip(row, other, strict=True)) for other in rows)
        expected.append(sum(d[1:5]))
    assert scores.tolist() == pytest.approx(expected, rel=1e-6)
    # Krum picks the most central honest update; multi-Krum (m = 3) averages the three best.
    assert flat(robust.krum(records(rows), f=1)) == pytest.approx([0.2, 0, 0, 0, 0], abs=1e-6)
    assert flat(robust.krum(records(rows), f=1, m=3)) == pytest.approx([0.2, 0, 0, 0, 0], abs=1e-6)
    assert flat(robust.krum(records(rows), f=1, m=5)) == pytest.approx([0.2, 0, 0, 0, 0], abs=1e-6)


def test_krum_with_fewer_updates_than_its_f_needs_lowers_f_and_with_two_takes_their_mean():
    rows = ROWS[:4]  # f = 5 would need 13; with 4, f = ⌊(4 − 3)/2⌋ = 0
    assert robust.krum(records(rows), f=5).keys() == {"model"}
    assert flat(robust.krum(records(ROWS[:2]), f=1)) == pytest.approx(np.mean(ROWS[:2], axis=0).tolist(), abs=1e-6)


@pytest.mark.parametrize("name", ["median", "trimmed_mean", "krum"])
def test_one_huge_update_moves_a_robust_aggregate_only_within_the_honest_range(name):
    honest = ROWS[:6]
    poisoned = honest + [[1e5] * 5]
    out = flat(robust.aggregate(name, AggregationConfig(trim_fraction=0.2, krum_byzantine=1), records(poisoned)))
    lo, hi = np.min(honest, axis=0), np.max(honest, axis=0)
    assert all(lo[i] - 1e-6 <= out[i] <= hi[i] + 1e-6 for i in range(5)), (out, lo, hi)


def test_clip_bounds_the_norm_of_the_whole_record_and_keeps_small_updates():
    big = records([[3, 4, 12, 0, 0]])[0]  # norm 13
    clipped = privacy.clip(big, 1.0)
    assert privacy.norm(clipped) == pytest.approx(1.0)
    assert flat(clipped) == pytest.approx([3 / 13, 4 / 13, 12 / 13, 0, 0])
    assert flat(privacy.clip(big, 20.0)) == pytest.approx(flat(big))


def test_noise_is_a_function_of_the_seed_round_and_edge():
    config = RunConfig(weighting="uniform", privacy={"noise": "edge", "noise_multiplier": 1.0, "clip_norm": 0.5})
    updates = records(ROWS[:3])
    first = privacy.noised_sum(config, updates, round=4, edge_id=1)
    assert flat(first) == flat(privacy.noised_sum(config, updates, round=4, edge_id=1))
    assert flat(first) != flat(privacy.noised_sum(config, updates, round=4, edge_id=0))
    assert flat(first) != flat(privacy.noised_sum(config, updates, round=5, edge_id=1))


def test_noise_does_not_depend_on_the_order_a_record_lists_its_tensors():
    """A result decoded from the wire lists its tensors sorted; the model that made it, in its own order: the
    services and the reference runner must still draw the same noise for each tensor."""
    config = RunConfig(weighting="uniform", privacy={"noise": "edge"})
    update = records(ROWS[:1])[0]
    reordered = {"model": dict(reversed(list(update["model"].items())))}
    a = privacy.noised_sum(config, [update], round=0, edge_id=0)
    b = privacy.noised_sum(config, [reordered], round=0, edge_id=0)
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])


def private(**privacy_: object) -> RunConfig:
    return RunConfig(rounds=6, weighting="uniform", fraction=0.5, model={"name": "logreg"},
                     data={"dataset": "digits", "num_clients": 8}, topology={"num_edges": 2, "buffer_size": 2},
                     privacy={"noise": "edge", "noise_multiplier": 1.5, "clip_norm": 0.5, **privacy_})


def test_epsilon_grows_as_opacus_rdp_accountant_says():
    from opacus.accountants import RDPAccountant

    config = private()
    accountant = RDPAccountant()
    for t in range(1, 7):
        accountant.step(noise_multiplier=1.5, sample_rate=0.5)  # 2 of each edge's 4 clients a round
        assert privacy.epsilon(config, t) == pytest.approx(accountant.get_epsilon(1e-5), rel=1e-9)
    # Client noise: the edge sees who answered, so no amplification by sampling (q = 1); κ edge rounds compose.
    local = RunConfig.model_validate({**config.model_dump(), "privacy": {**config.privacy.model_dump(),
                                                                          "noise": "client"}})
    fresh = RDPAccountant()
    for _ in range(3):
        fresh.step(noise_multiplier=1.5, sample_rate=1.0)
    assert privacy.epsilon(local, 3) == pytest.approx(fresh.get_epsilon(1e-5), rel=1e-9)


def test_the_run_stops_at_the_budget_and_records_epsilon_in_every_round():
    unlimited = private()
    eps = [privacy.epsilon(unlimited, t) for t in range(1, 7)]
    budget = (eps[2] + eps[3]) / 2  # room for three rounds, not four
    config = private(epsilon_budget=budget)
    assert privacy.rounds_to_run(config) == 3
    result = run_reference(config)
    assert [h.epsilon for h in result.history] == pytest.approx(eps[:3])
    assert len(result.history) == 3
    # The same rounds as the unlimited run: the budget only ends it.
    longer = run_reference(unlimited, rounds=3)
    assert all(torch.equal(result.global_state[k], longer.global_state[k]) for k in longer.global_state)
    assert run_reference(RunConfig(rounds=1, model={"name": "logreg"},
                                   data={"dataset": "digits", "num_clients": 2})).history[0].epsilon is None


def test_dp_sgd_epsilon_is_the_least_protected_clients_and_grows_with_the_rounds():
    config = RunConfig(model={"name": "logreg"}, data={"dataset": "digits", "num_clients": 4},
                       local={"batch_size": 16, "epochs": 2}, privacy={"dp_sgd_noise_multiplier": 1.0})
    sizes = {len(c.train) for c in load_federated(config.data, config.seed).clients}
    expected = max(privacy._epsilon(16 / n, 1.0, 3 * 2 * math.ceil(n / 16), 1e-5) for n in sizes)
    assert privacy.dp_sgd_epsilon(config, 3) == pytest.approx(expected)
    assert 0 < privacy.dp_sgd_epsilon(config, 1) < privacy.dp_sgd_epsilon(config, 3)  # type: ignore[operator]
    assert privacy.dp_sgd_epsilon(RunConfig(), 3) is None and privacy.epsilon(config, 3) is None


@pytest.mark.parametrize("algorithm, refusal", [("fedprox", "adds a term to the local loss"),
                                                ("scaffold", "does not support DP-SGD")])
def test_dp_sgd_is_refused_where_local_training_is_not_plain_sgd(algorithm, refusal):
    with pytest.raises(ValueError, match=refusal):
        registry.check(RunConfig(algorithm=algorithm, privacy={"dp_sgd_noise_multiplier": 1.0}))
    registry.check(RunConfig(privacy={"dp_sgd_noise_multiplier": 1.0}))
