"""Per-client reports of a run: each client's latest metrics, grouped by model family for hfpl."""
import csv
import io
import json
import math
from datetime import datetime, timezone
from pathlib import Path

import pytest
from rich.console import Console

from fl_services.fedctl import display
from fl_services.fedctl.display import failures, history_table
from fl_services.fedctl.report import export_history, save_results, write_history_csv, write_history_json
from fl_services.shared.core.algorithms.base import Contribution
from fl_services.shared.core.client_reports import client_reports, group_summary
from fl_services.shared.core.cloud_round import CloudRoundOutcome, round_record
from fl_services.shared.core.config import RunConfig
from fl_services.shared.core.reports import ClientFailure, ClientParticipation, HeldOut, RunStatus
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


def with_failures_and_pending() -> list:
    """Round 0 with client 5 failing, round 1 not evaluated yet (NaN figures)."""
    failing = Contribution(2, 0, {}, 1.0, (ClientParticipation(client_id=2, num_samples=5, loss=0.1),),
                           (ClientFailure(client_id=5, error="ModuleNotFoundError: No module named\n'pkg'",
                                          kind="user_code"),))
    first = round_record(0, [failing], CloudRoundOutcome({}, {}, Evaluation(0.5, 0.75, 0), {}), AT, AT, AT)
    second = round_record(1, [failing], CloudRoundOutcome({}, {}, Evaluation(math.nan, math.nan, 0), {}), AT, AT, AT)
    return [first, second]


def test_the_csv_export_has_failed_clients_with_their_reasons_and_empty_unevaluated_cells():
    out = io.StringIO()
    write_history_csv(out, with_failures_and_pending())
    rows = list(csv.DictReader(io.StringIO(out.getvalue())))
    assert [(r["round"], r["version"], r["failed"], r["failed_clients"]) for r in rows] == [
        ("0", "1", "1", "5 (user_code): ModuleNotFoundError: No module named 'pkg'"),
        ("1", "2", "1", "5 (user_code): ModuleNotFoundError: No module named 'pkg'")]
    assert (rows[0]["test_accuracy"], rows[1]["test_accuracy"], rows[1]["test_loss"]) == ("0.750000", "", "")


def test_the_json_export_is_strict_json_with_failed_clients(tmp_path):
    path = tmp_path / "history.json"
    write_history_json(path, with_failures_and_pending())

    def refuse(constant):
        raise ValueError(constant)

    records = json.loads(path.read_text(), parse_constant=refuse)
    assert [r["round"] for r in records] == [0, 1]
    assert records[0]["failed_clients"] == [{"client_id": 5, "edge_id": 2,
                                             "error": "ModuleNotFoundError: No module named\n'pkg'",
                                             "kind": "user_code"}]
    assert records[1]["test_accuracy"] is None and records[0]["test_accuracy"] == 0.75


def test_export_png_plots_the_evaluated_rounds(tmp_path):
    info = RunInfo(run_id="r", status=RunStatus.running, config=CONFIG, version=2, rounds=2, buffered=0,
                   created_at=AT)
    assert export_history(info, with_failures_and_pending(), "png", tmp_path / "a.png") == str(tmp_path / "a.png")
    assert (tmp_path / "a.png").read_bytes()[:4] == b"\x89PNG"
    with pytest.raises(ValueError, match="a png goes to a file"):
        export_history(info, with_failures_and_pending(), "png", Path("-"))


def test_results_show_failures_and_number_rounds_from_zero():
    history = with_failures_and_pending()
    assert failures(history) == ["client 5 failed 2 round(s) (user_code), last in round 1: ModuleNotFoundError: "
                                 "No module named 'pkg'"]
    console = Console(width=200, record=True)
    console.print(history_table(history, "t"))
    rows = [line.split() for line in console.export_text().splitlines() if line.strip()[:1].isdigit()]
    assert [(r[0], r[2]) for r in rows] == [("0", "1"), ("1", "1")]  # round, failed
    assert "75.00%" in rows[0] and "–" in rows[1]


def test_the_exports_say_which_evaluation_each_figure_comes_from(tmp_path):
    """test_*: the cloud's test set; federated_*: the devices' held-out splits, with each site's figures."""
    def site(edge_id, accuracy, n):
        clients = (ClientParticipation(client_id=edge_id, num_samples=5, loss=0.1,
                                       evaluation=HeldOut(loss=0.5, accuracy=accuracy, num_samples=n)),)
        return Contribution(edge_id, 0, {}, 1.0, clients, evaluation=HeldOut(loss=0.5, accuracy=accuracy,
                                                                            num_samples=n))

    record = round_record(0, [site(1, 0.5, 30), site(0, 1.0, 10)],
                          CloudRoundOutcome({}, {}, Evaluation(math.nan, math.nan, 0), {}), AT, AT, AT)
    out = io.StringIO()
    write_history_csv(out, [record])
    [row] = list(csv.DictReader(io.StringIO(out.getvalue())))
    assert (row["test_accuracy"], row["federated_version"], row["federated_accuracy"], row["federated_samples"]) ==\
        ("", "0", "0.625000", "40")
    assert row["federated_sites"] == "v0 edge 0: 1.000000 (10) | v0 edge 1: 0.500000 (30)"
    path = tmp_path / "history.json"
    write_history_json(path, [record])
    [saved] = json.loads(path.read_text())
    assert saved["test_accuracy"] is None
    assert saved["federated"] == [{"loss": 0.5, "accuracy": 0.625, "num_samples": 40, "version": 0, "sites": [
        {"loss": 0.5, "accuracy": 1.0, "num_samples": 10, "edge_id": 0},
        {"loss": 0.5, "accuracy": 0.5, "num_samples": 30, "edge_id": 1}]}]
    assert [c["evaluation"]["num_samples"] for c in saved["clients"]] == [10, 30]


def test_why_a_run_stopped_is_printed_as_the_devices_said_it_not_as_markup(monkeypatch):
    failing = Contribution(2, 0, {}, 1.0, (), (ClientFailure(client_id=5, error="[/] [bold]no GPU", kind="training"),))
    history = [round_record(0, [failing], CloudRoundOutcome({}, {}, Evaluation(0.5, 0.75, 0), {}), AT, AT, AT)]
    info = RunInfo(run_id="r", status=RunStatus.stopped, config=CONFIG, version=1, rounds=2, buffered=0,
                   created_at=AT, reason="every device failed in round 1 (1 device(s)): [/] [bold]no GPU")
    monkeypatch.setattr(display, "console", Console(width=200, record=True))
    display.show_why(info, history)
    assert display.console.export_text().splitlines() == [
        "stopped: every device failed in round 1 (1 device(s)): [/] [bold]no GPU",
        "client 5 failed 1 round(s) (training), last in round 0: [/] [bold]no GPU"]
