"""Run results on disk: history as JSON and CSV, per-client reports, an accuracy plot, the final model.

Rounds are numbered as the history's `round` field numbers them (from 0), as the dashboard and `fedctl results`
show them; a figure not evaluated yet is null in JSON and an empty cell in CSV."""
from __future__ import annotations

import csv
import json
import math
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Literal, TextIO

from fl_services.shared.core.reports import RoundRecord
from fl_services.shared.runtime.extras import optional
from fl_services.shared.wire.admin import RunInfo

if TYPE_CHECKING:
    from fl_services.shared.core.tensors import Tensors


def save_results(out_dir: Path, info: RunInfo, history: list[RoundRecord], model: Tensors) -> dict[str, Path]:
    # torch (the model, the algorithm's groups) loads here: `fedctl export` writes a history without it.
    from fl_services.shared.core.algorithms import registry
    from fl_services.shared.core.client_reports import client_reports
    from fl_services.shared.core.tensors import encode

    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {
        "run": out_dir / "run.json",
        "history_json": out_dir / "history.json",
        "history_csv": out_dir / "history.csv",
        "plot": out_dir / "accuracy.png",
        "model": out_dir / "model.safetensors",
    }
    paths["run"].write_text(info.model_dump_json(indent=2))
    write_history_json(paths["history_json"], history)
    write_history_csv(paths["history_csv"], history)
    reports = client_reports(history)
    if any(len(r) > 2 for r in reports.values()):  # clients reported metrics of their own
        algorithm = registry.create(info.config)
        paths["clients_csv"] = out_dir / "clients.csv"
        names = sorted({n for r in reports.values() for n in r} - {"edge", "rounds"})
        with paths["clients_csv"].open("w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["client", "group", "edge", "results_consumed", *names])
            for k, r in sorted(reports.items()):
                writer.writerow([k, algorithm.client_group(k), int(r["edge"]), int(r["rounds"]),
                                 *(f"{r[n]:.6f}" if n in r else "" for n in names)])
    plot_accuracy({info.config.name: history}, paths["plot"])
    paths["model"].write_bytes(encode(model))
    return paths


# test_*: on the test set the cloud loads; federated_*: on the devices' held-out splits (RunConfig.evaluation), of
# the newest version the update's contributions were computed on, with each site's figures in federated_sites.
HISTORY_COLUMNS = ["round", "version", "participants", "edges", "train_loss", "test_loss", "test_accuracy",
                   "elapsed_s", "energy_j", "cumulative_energy_j", "client_ids", "failed", "failed_clients",
                   "federated_version", "federated_loss", "federated_accuracy", "federated_samples", "federated_sites"]


def write_history_json(path: Path | TextIO, history: list[RoundRecord]) -> None:
    """The history as the API serves it (failed clients with their errors included): a JSON list, strict JSON."""
    text = json.dumps([json.loads(h.model_dump_json()) for h in history], indent=2, allow_nan=False) + "\n"
    _write(path, text)


def write_history_csv(path: Path | TextIO, history: list[RoundRecord]) -> None:
    """One row per round; `failed_clients` holds each client that could not train, the kind of failure and what it
    reported ("3 (user_code): ModuleNotFoundError: No module named 'pkg' | 5 (data): ...")."""
    with _open(path) as f:
        writer = csv.writer(f)
        writer.writerow(HISTORY_COLUMNS)
        cumulative: float | None = None  # stays None where the run models no device (not measured)
        for h in history:
            if h.energy_j is not None:
                cumulative = (cumulative or 0.0) + h.energy_j
            writer.writerow([h.round, h.version, len(h.clients), " ".join(map(str, h.edges)), _cell(h.train_loss),
                             _cell(h.test_loss), _cell(h.test_accuracy), f"{h.elapsed_s:.3f}", _cell(h.energy_j),
                             _cell(cumulative), " ".join(str(c.client_id) for c in h.clients), len(h.failed_clients),
                             " | ".join(f"{f.client_id} ({f.kind}): {' '.join(f.error.split())}"
                                        for f in h.failed_clients),
                             *_federated_cells(h)])


def _federated_cells(h: RoundRecord) -> list[str]:
    """The newest version's federated figures, and every version's per site ("v1 edge 0: 0.812500 (48)")."""
    if not h.federated:
        return ["", "", "", "", ""]
    newest = h.federated[-1]
    sites = " | ".join(f"v{f.version} edge {s.edge_id}: {s.accuracy:.6f} ({s.num_samples})"
                       for f in h.federated for s in f.sites)
    return [str(newest.version), _cell(newest.loss), _cell(newest.accuracy), str(newest.num_samples), sites]


ExportFormat = Literal["csv", "json", "png"]


def export_history(info: RunInfo, history: list[RoundRecord], fmt: ExportFormat, out: Path | None) -> str:
    """Writes a run's history as `fmt` to `out` (None: RUN_ID.FORMAT here; "-": standard output, csv and json
    only) and says where."""
    out = out or Path(f"{info.run_id}.{fmt}")
    if fmt == "png":
        if str(out) == "-":
            raise ValueError("a png goes to a file: give --out FILE.png")
        plot_accuracy({info.config.name: history}, out, title=f"{info.run_id}: test accuracy per round")
        return str(out)
    target: Path | TextIO = sys.stdout if str(out) == "-" else out
    (write_history_csv if fmt == "csv" else write_history_json)(target, history)
    return "standard output" if target is sys.stdout else str(out)


def _cell(x: float | None) -> str:
    return "" if x is None or math.isnan(x) else f"{x:.6f}"


@contextmanager
def _open(target: Path | TextIO) -> Iterator[TextIO]:
    """A path opened for writing text (and closed after), or a stream as it is (left open)."""
    if isinstance(target, Path):
        with target.open("w", newline="") as f:
            yield f
    else:
        yield target


def _write(target: Path | TextIO, text: str) -> None:
    with _open(target) as f:
        f.write(text)


def plot_accuracy(curves: dict[str, list[RoundRecord]], path: Path, title: str = "Test accuracy per round") -> Path:
    matplotlib = optional("matplotlib", "plot", "plotting")  # an extra: a device's install has no plotting
    matplotlib.use("Agg")  # files only: no display on servers and CI
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=120)
    for label, history in curves.items():
        evaluated = [h for h in history if not math.isnan(h.test_accuracy)]
        ax.plot([h.round for h in evaluated], [100 * h.test_accuracy for h in evaluated], marker="o", ms=3,
                label=label)
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("round")
    ax.set_ylabel("test accuracy (%)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
