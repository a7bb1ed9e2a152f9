"""Asynchronous hierarchical prototype learning through the services, against sync and local-only.

Task: MNIST 5k, Dirichlet(0.3) over 12 clients under 3 edges (4 each), feature extractors of three
families (mlp, cnn, cnn_deep, mixed within every edge), K = 1 local epoch, B = 32, lr 0.1, λ_p = 0.05,
d = 64, seed 0. Edge 2 is made 3× slower (FL_EDGE_SLOWDOWN=3). Two runs on one running topology
(private redis-server, cloud, 3 edges, 3 client processes):
  async: buffer B = 2 — an update as soon as two edges have reported;
  sync:  buffer B = L = 3 — every update waits for the slow edge.
Accuracy is each client's held-out accuracy with its own f_i and the G it last received, averaged over
clients (their latest reports). The local-only baseline trains each client's f_i with a private linear
head on its own data alone, for as many epochs as that client trained in the async run, and tests it on
the same held-out split. Writes docs/benchmarks/hfpl.{md,json,png}.

    ./fl bench/hfpl.py [--async-rounds 45] [--sync-rounds 18] [--target 0.9]
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path

import torch
from provenance import BENCHMARKS, stamp, stamped
from torch import nn

from fl_services.client.state import ClientStateStore
from fl_services.fedctl.api import CloudAPI
from fl_services.fedctl.launch import LocalTopology
from fl_services.shared.core.algorithms import registry
from fl_services.shared.core.algorithms.hfpl import HFPL, train_alone
from fl_services.shared.core.client_reports import client_reports
from fl_services.shared.core.config import RunConfig
from fl_services.shared.core.data import load_federated
from fl_services.shared.core.reports import RoundRecord

DOCS = BENCHMARKS
SLOW_EDGE, SLOWDOWN = 2, 3.0


def config_for(name: str, buffer_size: int, rounds: int) -> RunConfig:
    return RunConfig.model_validate({
        "name": name, "algorithm": "hfpl", "rounds": rounds, "seed": 0,
        "data": {"dataset": "mnist5k", "partition": "dirichlet", "alpha": 0.3, "num_clients": 12},
        "local": {"epochs": 1, "batch_size": 32, "lr": 0.1},
        "topology": {"num_edges": 3, "buffer_size": buffer_size},
        "params": {"proto_weight": 0.05, "feature_dim": 64, "feature_cap": 100},
        "policy": {"deadline_s": 120},
    })


def accuracies_alone(algorithm: HFPL, config: RunConfig, client_id: int,
                     epochs: set[int]) -> dict[int, tuple[float, float]]:
    """The client's own f_i (same family and initial weights) and a private linear head, trained on its
    data alone with the run's local settings, in one run to the largest budget: after each budget in
    `epochs`, its accuracy on the client's held-out split and on the pooled test set."""
    data = load_federated(config.data, config.seed)
    tests = (data.clients[client_id].test, data.test)
    at: dict[int, tuple[float, float]] = {}

    def record(epoch: int, model: nn.Module) -> None:
        if epoch in epochs:
            with torch.no_grad():
                at[epoch] = tuple(float((model(d.x).argmax(1) == d.y).float().mean()) for d in tests)

    train_alone(algorithm, client_id, data.clients[client_id].train, max(epochs), after_epoch=record)
    return at


def final_evaluation(algorithm: HFPL, config: RunConfig, state_dir: Path, run_id: str,
                     global_: dict) -> dict[int, dict[str, float]]:
    """Every client's last f_i (read from its state on disk) with the run's final (C̄, G): on its own
    held-out split and on the pooled test set of all classes."""
    data = load_federated(config.data, config.seed)
    out = {}
    for k in range(config.data.num_clients):
        state = ClientStateStore(state_dir, run_id, k).load()
        own = algorithm.evaluate_client(k, state, global_, data.clients[k].test)
        pooled = algorithm.evaluate_client(k, state, global_, data.test)
        out[k] = {"accuracy": own["accuracy"], "proto_accuracy": own.get("proto_accuracy", float("nan")),
                  "pooled_accuracy": pooled["accuracy"]}
    return out


def time_to(history: list[RoundRecord], target: float) -> float | None:
    return next((h.elapsed_s for h in history if h.test_accuracy >= target), None)


def time_stable(history: list[RoundRecord], target: float) -> float | None:
    """From when on the accuracy never falls below the target again (first reports of late clients dip it)."""
    below = [i for i, h in enumerate(history) if h.test_accuracy < target]
    start = below[-1] + 1 if below else 0
    return history[start].elapsed_s if start < len(history) else None


def median(values: list[float | None]) -> float | None:
    """None (not reached) counts as later than any time."""
    ordered = sorted(values, key=lambda v: math.inf if v is None else v)
    return ordered[len(ordered) // 2]


def seconds(value: float | None) -> str:
    return f"{value:.1f} s" if value is not None else "not reached"


def spread(values: list[float]) -> str:
    sd = statistics.pstdev(values) if len(values) > 1 else 0.0
    return f"{100 * statistics.mean(values):.1f} ± {100 * sd:.1f}%"


def plot(curves: dict[str, list[list[RoundRecord]]], local_mean: float, target: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for (label, repeats), colour in zip(curves.items(), ("tab:blue", "tab:orange"), strict=True):
        for i, history in enumerate(repeats):
            ax.plot([h.elapsed_s for h in history], [100 * h.test_accuracy for h in history], marker="o", ms=2,
                    color=colour, alpha=1.0 if i == 0 else 0.35, lw=1.2 if i == 0 else 0.8,
                    label=f"{label} ({len(repeats)} runs)" if i == 0 else None)
    ax.axhline(100 * local_mean, color="grey", ls="--", lw=1, label="local only (same epochs as async)")
    ax.axhline(100 * target, color="black", ls=":", lw=1, label=f"target {100 * target:.0f}%")
    ax.set_xlabel("wall-clock time since start (s)")
    ax.set_ylabel("mean client held-out accuracy (%)")
    ax.set_title(f"HFPL, MNIST 5k Dirichlet(0.3), 12 clients / 3 edges, edge {SLOW_EDGE} {SLOWDOWN:.0f}× slower")
    save_figure(fig, ax, path)


def save_figure(fig, ax, path: Path) -> None:
    """The benches' figure finish: grid, legend at the lower right, written at 120 dpi and closed."""
    import matplotlib.pyplot as plt

    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--async-rounds", type=int, default=45)
    parser.add_argument("--sync-rounds", type=int, default=18)
    parser.add_argument("--target", type=float, default=0.90)
    parser.add_argument("--repeats", type=int, default=3,
                        help="runs of each mode, alternating; the arrival order (so the async result) varies")
    args = parser.parse_args()
    line = stamp()
    torch.set_num_threads(1)
    runs = {"async (B = 2)": config_for("hfpl-async", 2, args.async_rounds),
            "sync (B = L = 3)": config_for("hfpl-sync", 3, args.sync_rounds)}
    repeats: dict[str, list[list[RoundRecord]]] = {label: [] for label in runs}
    finals: dict[str, dict[int, dict[str, float]]] = {}
    with LocalTopology(num_clients=12, num_edges=3, procs_per_edge=1,
                       edge_env={SLOW_EDGE: {"FL_EDGE_SLOWDOWN": str(SLOWDOWN)}}) as topo,\
            CloudAPI(topo.cloud_url, topo.admin_token) as api:
        for r in range(args.repeats):
            for label, config in runs.items():
                run_id = api.create_run(config.model_copy(update={"name": f"{config.name}-{r}"})).run_id
                api.action(run_id, "start")
                api.wait(run_id, timeout_s=3600)
                history = api.history(run_id)
                repeats[label].append(history)
                if r == 0:
                    finals[label] = final_evaluation(registry.create(config), config,
                                                     topo.workdir / "client-state", run_id, api.model(run_id))
                print(f"{label:18s} run {r}: {len(history)} updates in {history[-1].elapsed_s:6.1f}s  final "
                      f"{100 * history[-1].test_accuracy:.1f}%  to {100 * args.target:.0f}%: first "
                      f"{time_to(history, args.target)}, stays from {time_stable(history, args.target)}", flush=True)
    curves = {label: runs_[0] for label, runs_ in repeats.items()}

    async_label = next(iter(runs))
    config = runs[async_label]
    algorithm = registry.create(config)
    latest = client_reports(curves[async_label])
    clients = []
    final = finals[async_label]
    total = len(curves[async_label])
    budget_updates = sorted(({5, 10, 20, 30} & set(range(1, total))) | {total})
    # Each client's epochs after each budget; local only trains once per client up to the largest.
    epochs_at = {n: {k: int(r["rounds"]) * config.local.epochs
                     for k, r in client_reports(curves[async_label][:n]).items()} for n in budget_updates}
    alone_at = {k: accuracies_alone(algorithm, config, k, {e[k] for e in epochs_at.values() if k in e})
                for k in sorted(latest)}
    for k in sorted(latest):
        epochs = int(latest[k]["rounds"]) * config.local.epochs
        alone_own, alone_pooled = alone_at[k][epochs]
        clients.append({"client": k, "edge": k % config.topology.num_edges, "family": algorithm.family_of(k),
                        "epochs": epochs, "federated": final[k]["accuracy"],
                        "nearest_prototype": final[k]["proto_accuracy"], "local_only": alone_own,
                        "federated_pooled": final[k]["pooled_accuracy"], "local_only_pooled": alone_pooled,
                        "last_report": latest[k]["accuracy"]})
    fed = [c["federated"] for c in clients]
    alone = [c["local_only"] for c in clients]
    gap = statistics.mean(fed) - statistics.mean(alone)
    print(f"federated {spread(fed)} vs local only {spread(alone)}: +{100 * gap:.1f} points")

    # The same comparison after fewer updates: the gap depends on the epoch budget.
    budgets = ["| async updates | epochs per client | federated | local only, same epochs | difference |",
               "|---|---|---|---|---|"]
    budget_rows = []
    for n in budget_updates:
        early = client_reports(curves[async_label][:n])
        f_acc = [early[k]["accuracy"] for k in sorted(early)]
        epochs = [epochs_at[n][k] for k in sorted(early)]
        a_acc = [alone_at[k][e][0] for k, e in zip(sorted(early), epochs, strict=True)]
        diff = statistics.mean(f_acc) - statistics.mean(a_acc)
        budget_rows.append({"updates": n, "clients": len(early), "federated": statistics.mean(f_acc),
                            "local_only": statistics.mean(a_acc), "epochs": epochs})
        budgets.append(f"| {n} | {min(epochs)}–{max(epochs)} | {spread(f_acc)} | {spread(a_acc)} | "
                       f"{100 * diff:+.1f} points |")
        print(budgets[-1], flush=True)

    rows = ["| family | clients | federated (G∘f_i) | nearest prototype (C̄) | local only, same epochs "
            "| federated, pooled test | local only, pooled test |", "|---|---|---|---|---|---|---|"]
    for family in [*config.params.get("families", ["mlp", "cnn", "cnn_deep"]), None]:
        group = [c for c in clients if family is None or c["family"] == family]
        if group:
            rows.append(f"| {family or 'all'} | {len(group)} | " + " | ".join(
                spread([c[key] for c in group]) for key in
                ("federated", "nearest_prototype", "local_only", "federated_pooled", "local_only_pooled")) + " |")
    timing = ["| run | updates | wall time | final accuracy | first at target | at or above target from |",
              "|---|---|---|---|---|---|"]
    medians = {}
    for label, runs_ in repeats.items():
        firsts = [time_to(h, args.target) for h in runs_]
        stables = [time_stable(h, args.target) for h in runs_]
        for i, history in enumerate(runs_):
            timing.append(f"| {label} #{i + 1} | {len(history)} | {history[-1].elapsed_s:.0f} s | "
                          f"{100 * history[-1].test_accuracy:.1f}% | {seconds(firsts[i])} | {seconds(stables[i])} |")
        medians[label] = (median(firsts), median(stables))
        timing.append(f"| **{label}, median** | | | | **{seconds(medians[label][0])}** | "
                      f"**{seconds(medians[label][1])}** |")
    (a_first, a_stable), (s_first, s_stable) = medians.values()
    speedup = (f"Median time to {100 * args.target:.0f}%: async {seconds(a_first)} against sync {seconds(s_first)} "
               f"(first reached), {seconds(a_stable)} against {seconds(s_stable)} (for good).")
    print(speedup)

    DOCS.mkdir(exist_ok=True)
    plot(repeats, statistics.mean(alone), args.target, DOCS / "hfpl.png")
    (DOCS / "hfpl.json").write_text(json.dumps({
        "target": args.target, "clients": clients, "budgets": budget_rows,
        "runs": {label: {"config": runs[label].model_dump(mode="json"),
                         "histories": [[h.model_dump(mode="json") for h in history] for history in runs_]}
                 for label, runs_ in repeats.items()},
    }, separators=(",", ":")))  # compact: six full histories
    text = (
        f"# Asynchronous hierarchical prototype learning\n\n"
        f"Produced by `./fl bench/hfpl.py` through the services (private redis-server, cloud, 3 edges, "
        f"3 client processes). MNIST 5k, Dirichlet(0.3) over 12 clients under 3 edges, families mlp / cnn / "
        f"cnn_deep mixed within every edge, K = 1, B = 32, lr 0.1, λ_p = 0.05, d = 64, seed 0; edge "
        f"{SLOW_EDGE} is {SLOWDOWN:.0f}× slower.\n\n"
        f"## Wall-clock time to {100 * args.target:.0f}% mean client accuracy\n\n"
        f"{args.repeats} runs of each mode, alternating, on one running topology. The accuracy of an update is "
        f"the mean over clients of each one's latest report, so it dips when stale triples of the slow edge "
        f"arrive; \"for good\" is the time from which it stays at or above the target.\n\n"
        + "\n".join(timing) + f"\n\n{speedup}" +
        "\n\n## Per client, at the end of the first async run (mean ± spread over clients)\n\n"
        "Each client's last f_i (from its state on disk) with the final (C̄, G), on its own held-out split "
        "(skewed like its training data) and on the pooled test set of all classes:\n\n" + "\n".join(rows) +
        f"\n\nFederated minus local only: {100 * gap:+.1f} points. Local only trains each client's own f_i "
        f"with a private head for as many epochs as that client trained in the async run "
        f"({min(c['epochs'] for c in clients)}–{max(c['epochs'] for c in clients)}; the slow edge's clients "
        f"train less often). How much there is to gain on this task (models trained on the pooled data, "
        f"three partition seeds): [hfpl-headroom.md](hfpl-headroom.md).\n\n"
        f"## Federated against local only, by budget\n\n"
        f"The same comparison after the first n updates of the async run (clients that had trained by then; "
        f"local only with each one's epochs up to that point):\n\n" + "\n".join(budgets) +
        "\n\n![accuracy over wall-clock time](hfpl.png)\n"
    )
    (DOCS / "hfpl.md").write_text(stamped(text, line))
    print("\n".join(timing + [""] + rows))


if __name__ == "__main__":
    main()
