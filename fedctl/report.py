"""Run results on disk: history as JSON and CSV, per-client reports, an accuracy plot, the final model."""
from __future__ import annotations

import csv
import json
from pathlib import Path

from fl_services.shared.core.algorithms import registry
from fl_services.shared.core.client_reports import client_reports
from fl_services.shared.core.reports import RoundRecord
from fl_services.shared.core.tensors import Tensors, encode
from fl_services.shared.wire.admin import RunInfo


def save_results(out_dir: Path, info: RunInfo, history: list[RoundRecord], model: Tensors) -> dict[str, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {
        "run": out_dir / "run.json",
        "history_json": out_dir / "history.json",
        "history_csv": out_dir / "history.csv",
        "plot": out_dir / "accuracy.png",
        "model": out_dir / "model.safetensors",
    }
    paths["run"].write_text(info.model_dump_json(indent=2))
    paths["history_json"].write_text(json.dumps([h.model_dump(mode="json") for h in history], indent=2))
    with paths["history_csv"].open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["round", "version", "participants", "edges", "train_loss", "test_loss", "test_accuracy",
                         "elapsed_s", "energy_j", "cumulative_energy_j", "client_ids"])
        cumulative = 0.0
        for h in history:
            cumulative += h.energy_j
            writer.writerow([h.round, h.version, len(h.clients), " ".join(map(str, h.edges)), f"{h.train_loss:.6f}",
                             f"{h.test_loss:.6f}", f"{h.test_accuracy:.6f}", f"{h.elapsed_s:.3f}",
                             f"{h.energy_j:.6f}", f"{cumulative:.6f}", " ".join(str(c.client_id) for c in h.clients)])
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


def plot_accuracy(curves: dict[str, list[RoundRecord]], path: Path, title: str = "Test accuracy per round") -> Path:
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on servers and CI
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=120)
    for label, history in curves.items():
        ax.plot([h.version for h in history], [100 * h.test_accuracy for h in history], marker="o", ms=3, label=label)
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("round (global model version)")
    ax.set_ylabel("test accuracy (%)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
