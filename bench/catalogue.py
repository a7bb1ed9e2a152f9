"""Every algorithm of the catalogue through the services on one federated task, side by side.

Task: MNIST 5k, Dirichlet(0.3) label skew over 20 clients, λ = 0.25 (5 clients per round), the small
CNN, E = 1, B = 32, lr 0.1, seed 0. Each run goes through the real cloud, edge and two client processes
(ten logical clients each) over HTTP with a private redis-server. Writes docs/benchmarks/catalogue.md
(table), docs/benchmarks/catalogue.json and docs/benchmarks/catalogue.png (accuracy per round).

    ./fl bench/catalogue.py [--rounds 40] [--only fedavg,scaffold]
"""
from __future__ import annotations

import argparse
import json
import time

from provenance import BENCHMARKS, stamp, stamped

from fl_services.fedctl.api import CloudAPI
from fl_services.fedctl.launch import LocalTopology
from fl_services.fedctl.report import plot_accuracy
from fl_services.shared.core.config import RunConfig

DOCS = BENCHMARKS

# Per-algorithm settings on top of the common task; the rest are each algorithm's defaults.
ALGORITHMS: dict[str, dict] = {
    "fedavg": {},
    "fedavg-nesterov": {"algorithm": "fedavg", "local": {"optimizer": "nesterov", "lr": 0.03, "momentum": 0.9}},
    "fedsgd": {"local": {"batch_size": 0, "lr": 0.2}},
    "fedprox": {"params": {"mu": 0.01}},
    "scaffold": {"local": {"lr": 0.05}},  # at lr 0.1 the corrected steps diverge on this CNN
    "fedvarp": {},
    "clusterfedvarp": {},
    "fedrolex": {},
    "fedscavar": {"params": {"mu": 0.01}, "local": {"lr": 0.05}},
    "pfedme": {},
}


def config_for(label: str, overrides: dict, rounds: int) -> RunConfig:
    local = {"epochs": 1, "batch_size": 32, "lr": 0.1, **overrides.get("local", {})}
    return RunConfig.model_validate({
        "name": label, "algorithm": overrides.get("algorithm", label), "params": overrides.get("params", {}),
        "rounds": rounds, "fraction": 0.25, "seed": 0, "model": {"name": "cnn"},
        "data": {"dataset": "mnist5k", "partition": "dirichlet", "alpha": 0.3, "num_clients": 20},
        "local": local, "policy": {"deadline_s": 60},
    })


def rounds_to(history, target: float) -> int | None:
    return next((h.version for h in history if h.test_accuracy >= target), None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--only", default="", help="comma-separated labels")
    args = parser.parse_args()
    labels = [x for x in args.only.split(",") if x] or list(ALGORITHMS)
    rows, curves = [], {}
    with LocalTopology(num_clients=20, num_edges=1, procs_per_edge=2) as topo,\
            CloudAPI(topo.cloud_url, topo.admin_token) as api:
        for label in labels:
            config = config_for(label, ALGORITHMS[label], args.rounds)
            run_id = api.create_run(config).run_id
            start = time.perf_counter()
            api.action(run_id, "start")
            api.wait(run_id, timeout_s=3600)
            wall = time.perf_counter() - start
            history = api.history(run_id)
            curves[label] = history
            last = history[-1]
            row = {
                "algorithm": label,
                "final_accuracy": last.test_accuracy,
                "best_accuracy": max(h.test_accuracy for h in history),
                "rounds_to_80": rounds_to(history, 0.80),
                "rounds_to_90": rounds_to(history, 0.90),
                "personal_accuracy": last.client_metrics.get("personal_accuracy"),
                "wall_s": wall,
                "accuracy_per_round": [h.test_accuracy for h in history],
                "config": config.model_dump(mode="json"),
            }
            rows.append(row)
            print(f"{label:16s} final {100 * row['final_accuracy']:6.2f}%  best {100 * row['best_accuracy']:6.2f}%  "
                  f"→90% in {row['rounds_to_90']}  wall {wall:6.1f}s", flush=True)
    line = stamp()
    DOCS.mkdir(exist_ok=True)
    (DOCS / "catalogue.json").write_text(json.dumps(rows, indent=2))
    plot_accuracy(curves, DOCS / "catalogue.png",
                  title="MNIST 5k, Dirichlet(0.3), 20 clients, λ = 0.25, CNN")
    lines = [
        "| algorithm | final acc. | best acc. | rounds to 80% | rounds to 90% | personalised acc. | wall time |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        personal = f"{100 * r['personal_accuracy']:.1f}%" if r["personal_accuracy"] is not None else "–"
        lines.append(f"| {r['algorithm']} | {100 * r['final_accuracy']:.1f}% | {100 * r['best_accuracy']:.1f}% | "
                     f"{r['rounds_to_80'] or '–'} | {r['rounds_to_90'] or '–'} | {personal} | {r['wall_s']:.0f} s |")
    header = (f"Every algorithm through the services: MNIST 5k, Dirichlet(0.3) over 20 clients, λ = 0.25, CNN, "
              f"E = 1, B = 32, lr 0.1 (per-algorithm settings in catalogue.json), {args.rounds} rounds, seed 0. "
              f"Produced by `./fl bench/catalogue.py`.\n\n")
    (DOCS / "catalogue.md").write_text(stamped(header + "\n".join(lines) + "\n\n![accuracy per round](catalogue.png)\n",
                                               line))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
