"""Per-client reports of a run: each client's latest metrics, grouped by model family for hfpl."""
import csv
from datetime import datetime, timezone

import pytest

from fl_services.fedctl.report import save_results
from fl_services.shared.core.algorithms.base import Contribution
from fl_services.shared.core.client_reports import client_reports, group_summary
from fl_services.shared.core.cloud_round import CloudRoundOutcome, round_record
from fl_services.shared.core.config import RunConfig
from fl_services.shared.core.reports import ClientParticipation, RunStatus
from fl_services.shared.core.training import Evaluation
from fl_services.shared.wire.admin import RunInfo

# 6 clients over 3 edges; families take turns over k // 3: clients 0-2 mlp, 3-5 cnn.
CONFIG = RunConfig.model_validate(dict(
    algorithm="hfpl", rounds=2, data=dict(dataset="digits", num_clients=6),
    topology=dict(num_edges=3, buffer_size=2), params=dict(families=["mlp", "cnn"])))
AT = datetime.now(timezone.utc)


def update(version: int, edge: int, reports: dict[int, float]):
    contribution = Contribution(edge, version, {}, 1.0, tuple(
        ClientParticipation(client_id=k, num_samples=5, loss=0.1, metrics={"accuracy": a}) for k, a in reports.items()))
    return round_record(version, [contribution], CloudRoundOutcome({}, {}, Evaluation(0.0, 0.0, 0), {}), AT, AT, AT)


HISTORY = [update(0, 0, {0: 0.5, 3: 0.7}), update(1, 1, {1: 0.9, 4: 0.6}), update(2, 0, {0: 0.8, 3: 0.9})]


def test_client_reports_keep_the_latest_metrics_and_count_results():
    reports = client_reports(HISTORY)
    assert reports == {0: {"accuracy": 0.8, "edge": 0, "rounds": 2}, 3: {"accuracy": 0.9, "edge": 0, "rounds": 2},
                       1: {"accuracy": 0.9, "edge": 1, "rounds": 1}, 4: {"accuracy": 0.6, "edge": 1, "rounds": 1}}


def test_group_summary_is_per_family_and_overall():
    summary = group_summary(CONFIG, client_reports(HISTORY))
    # mlp: clients 0 (0.8) and 1 (0.9); cnn: clients 3 (0.9) and 4 (0.6); all four: mean 0.8.
    assert summary["mlp"]["accuracy"] == pytest.approx((0.85, 0.05))
    assert summary["cnn"]["accuracy"] == pytest.approx((0.75, 0.15))
    assert summary["all"]["accuracy"][0] == pytest.approx(0.8)


def test_save_results_writes_the_client_table(tmp_path):
    info = RunInfo(run_id="r", status=RunStatus.finished, config=CONFIG, version=3, rounds=2, buffered=0,
                   created_at=AT)
    paths = save_results(tmp_path, info, HISTORY, {})
    rows = list(csv.DictReader(paths["clients_csv"].open()))
    assert [(r["client"], r["group"], r["results_consumed"], r["accuracy"]) for r in rows] == [
        ("0", "mlp", "2", "0.800000"), ("1", "mlp", "1", "0.900000"),
        ("3", "cnn", "2", "0.900000"), ("4", "cnn", "1", "0.600000")]
