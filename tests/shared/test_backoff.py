import random

import pytest

from fl_services.shared.wire.backoff import Backoff


def test_delays_grow_by_the_factor_up_to_the_cap_and_reset_after_a_success():
    backoff = Backoff(1.0, 30.0)
    assert [backoff.next() for _ in range(7)] == [1, 2, 4, 8, 16, 30, 30]
    assert backoff.failures == 7
    backoff.reset()
    assert backoff.failures == 0 and backoff.next() == 1.0
    tripling = Backoff(0.5, 10.0, factor=3)
    assert [tripling.next() for _ in range(5)] == [0.5, 1.5, 4.5, 10.0, 10.0]


def test_a_cap_below_the_initial_delay_keeps_the_initial_delay():
    backoff = Backoff(2.0, 1.0)
    assert [backoff.next() for _ in range(3)] == [2.0, 2.0, 2.0]


def test_jitter_stays_within_its_fraction_is_reproducible_by_seed_and_leaves_the_global_rng_alone():
    random.seed(7)
    expected_global = random.random()
    random.seed(7)
    plain = Backoff(1.0, 8.0)
    bounds = [plain.next() for _ in range(6)]
    jittered = Backoff(1.0, 8.0, jitter=0.5, seed=3)
    delays = [jittered.next() for _ in range(6)]
    assert all(d / 2 <= j <= d for j, d in zip(delays, bounds, strict=True))
    assert len(set(j / d for j, d in zip(delays, bounds, strict=True))) > 1  # drawn, not a fixed fraction
    again = Backoff(1.0, 8.0, jitter=0.5, seed=3)
    assert [again.next() for _ in range(6)] == delays
    other = Backoff(1.0, 8.0, jitter=0.5, rng=random.Random(4))
    assert [other.next() for _ in range(6)] != delays
    assert random.random() == expected_global  # nothing drew from the global generator


@pytest.mark.parametrize("args", [(-1.0, 5.0), (1.0, 5.0, 0.5), (1.0, 5.0, 2.0, 1.5)])
def test_nonsense_policies_are_refused(args):
    with pytest.raises(ValueError):
        Backoff(*args)
