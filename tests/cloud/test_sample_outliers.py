"""The rule that marks a round's sample-count outliers (cloud/services/sites.py, sample_outliers)."""
from datetime import datetime, timezone

import pytest

from fl_services.cloud.services.sites import OUTLIER_RATIO, sample_outliers
from fl_services.shared.core.reports import ClientRecord, RoundRecord

AT = datetime(2026, 1, 1, tzinfo=timezone.utc)


def record(counts: list[int]) -> RoundRecord:
    return RoundRecord(round=3, version=3, edges=[0], contributions=[], train_loss=1.0, test_loss=None,
                       test_accuracy=None, started_at=AT, finished_at=AT, elapsed_s=0.0,
                       clients=[ClientRecord(client_id=10 + i, edge_id=i % 2, num_samples=n, loss=1.0)
                                for i, n in enumerate(counts)])


@pytest.mark.parametrize(("counts", "flagged"), [
    ([100, 120, 90, 110 * int(OUTLIER_RATIO) + 1], [13]),  # just over the ratio × the median (110)
    ([100, 120, 90, 110 * int(OUTLIER_RATIO)], []),  # at it: not over
    ([100, 120, 1], []),  # a small claim gains no weight: not shown
    ([100, 10_000], []),  # two claims: no median to stand for the round
    ([100, 100, 100, 10_000, 10_000], [13, 14]),  # two liars among five leave the median where it was
    ([100, 100, 10_000, 10_000], []),  # half of the round lying moves the median (5050) to them
])
def test_claims_over_the_ratio_times_the_median_are_outliers(counts, flagged):
    found = sample_outliers(record(counts))
    assert [o.client_id for o in found] == flagged
    assert all(o.num_samples == counts[o.client_id - 10] and o.edge_id == (o.client_id - 10) % 2 for o in found)
