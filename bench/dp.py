"""DP-FedAvg: accuracy against ε for a few noise multipliers.

MNIST 5k IID over 100 clients under one edge, logistic regression (7,850 parameters), E = 1, B = 32, lr 0.1,
half the clients each round (q = 0.5), weighting uniform, every client's step clipped to S = 1 and
N(0, σ²S²) added to the edge's sum (privacy.noise = "edge": what the cloud and everyone after it see is
(ε, δ)-DP for every client, δ = 1e-5). ε after each round is what the run's history records (opacus's
RDP accountant, shared/core/algorithms/privacy.py). The reference runner computes the runs (the integration
tests show the services compute the same model and ε). Writes docs/benchmarks/dp.{md,json,png}.

With `--dp-sgd`, the same federation without DP-FedAvg, each client training with DP-SGD instead
(privacy.dp_sgd_noise_multiplier σ, every example's gradient clipped to C = 1, through opacus): accuracy and
the per-example ε the history records (the least protected client, as if it trained every round). Writes
docs/benchmarks/dp-sgd.{md,json}.

    ./fl python bench/dp.py [--rounds 30] [--workers 2] [--render] [--dp-sgd]
"""
from __future__ import annotations

import argparse
import json
import time
from concurrent.futures import ProcessPoolExecutor

import torch
from provenance import BENCHMARKS, earlier_stamp, stamp, stamped

from fl_services.shared.core.config import RunConfig
from fl_services.shared.core.reference import run_reference

DOCS = BENCHMARKS
NOISE = [None, 0.5, 1.0, 2.0, 4.0]  # None: no noise nor clipping (FedAvg)
CHECKPOINTS = (5, 10, 20, 30)
DP_SGD_NOISE = [None, 1.0, 2.0, 4.0]


def config(noise: float | None, rounds: int, dp_sgd: bool = False) -> RunConfig:
    if noise is None:
        privacy = {}
    elif dp_sgd:
        privacy = {"dp_sgd_noise_multiplier": noise, "dp_sgd_clip_norm": 1.0, "delta": 1e-5}
    else:
        privacy = {"noise": "edge", "noise_multiplier": noise, "clip_norm": 1.0, "delta": 1e-5}
    return RunConfig(name=f"dp-{noise}", rounds=rounds, fraction=0.5, weighting="uniform", model={"name": "logreg"},
                     data={"dataset": "mnist5k", "num_clients": 100}, local={"epochs": 1, "batch_size": 32, "lr": 0.1},
                     privacy=privacy)


def one_run(noise: float | None, rounds: int, dp_sgd: bool = False) -> dict:
    torch.set_num_threads(1)
    started = time.perf_counter()
    history = run_reference(config(noise, rounds, dp_sgd)).history
    return {"noise_multiplier": noise, "accuracy": [h.test_accuracy for h in history],
            "epsilon": [h.dp_sgd_epsilon if dp_sgd else h.epsilon for h in history],
            "seconds": time.perf_counter() - started}


def table(runs: list[dict]) -> list[str]:
    """Accuracy and ε at each checkpoint round, one row per noise multiplier."""
    points = [c for c in CHECKPOINTS if c <= len(runs[0]["accuracy"])]
    lines = [f"| noise | {' | '.join(f'round {c}: ε / accuracy' for c in points)} |",
             f"|---|{'---|' * len(points)}"]
    for run in runs:
        cells = [("∞" if run["epsilon"][c - 1] is None else f"{run['epsilon'][c - 1]:.2f}")
                 + f" / {run['accuracy'][c - 1]:.3f}" for c in points]
        lines.append(f"| {label(run['noise_multiplier'])} | {' | '.join(cells)} |")
    return lines


def render_dp_sgd(runs: list[dict], line: str) -> None:
    lines = [
        "# DP-SGD inside local training: accuracy against per-example ε",
        "",
        "Written by `bench/dp.py --dp-sgd` (its docstring has the setup: MNIST 5k over 100 clients, logistic",
        "regression, half the clients a round, E = 1, B = 32, every example's gradient clipped to C = 1, δ = 1e-5).",
        "ε protects one training example of one client (not a whole client, as DP-FedAvg's does), for the least",
        "protected client as if it trained every round: with about 40 examples a client, a batch of 32 samples",
        "most of them (q ≈ 0.8), so sampling amplifies little.",
        "",
        *table(runs),
        "",
        "Seconds per 30-round run (reference runner, 1 thread): "
        + ", ".join(f"{label(r['noise_multiplier'])} {r['seconds']:.0f} s" for r in runs) + ".",
    ]
    (DOCS / "dp-sgd.md").write_text(stamped("\n".join(lines) + "\n", line))


def label(noise: float | None) -> str:
    return "no DP" if noise is None else f"σ = {noise:g}"


def render(runs: list[dict], line: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rounds = len(runs[0]["accuracy"])
    lines = [
        "# DP-FedAvg: accuracy against ε",
        "",
        "Written by `bench/dp.py` (its docstring has the setup: MNIST 5k over 100 clients, logistic regression,",
        "half the clients a round, S = 1, noise added at the edge, δ = 1e-5). Accuracy on the held-out test set,",
        "ε as each round's history record gives it.",
        "",
        *table(runs),
    ]
    (DOCS / "dp.md").write_text(stamped("\n".join(lines) + "\n", line))

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8))
    for i, run in enumerate(runs):  # one colour per noise multiplier in both panels
        xs = range(1, rounds + 1)
        left.plot(xs, run["accuracy"], marker=".", color=f"C{i}", label=label(run["noise_multiplier"]))
        if run["noise_multiplier"] is not None:
            right.plot(run["epsilon"], run["accuracy"], marker=".", color=f"C{i}", label=label(run["noise_multiplier"]))
    baseline = runs[[r["noise_multiplier"] for r in runs].index(None)]["accuracy"][-1]
    right.axhline(baseline, color="grey", ls="--", label=f"no DP, round {rounds}")
    left.set(xlabel="round", ylabel="test accuracy", ylim=(0, 1))
    right.set(xlabel="ε (δ = 1e-5)", ylabel="test accuracy", ylim=(0, 1), xscale="log")
    for ax in (left, right):
        ax.grid(alpha=0.3)
        ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(DOCS / "dp.png", dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--render", action="store_true", help="rewrite dp.{md,png} from dp.json")
    parser.add_argument("--dp-sgd", action="store_true", help="DP-SGD in local training instead of DP-FedAvg")
    args = parser.parse_args()
    line = stamp()
    if args.dp_sgd:
        with ProcessPoolExecutor(args.workers) as pool:
            runs = list(pool.map(one_run, DP_SGD_NOISE, [args.rounds] * len(DP_SGD_NOISE),
                                 [True] * len(DP_SGD_NOISE)))
        (DOCS / "dp-sgd.json").write_text(json.dumps(runs, indent=1) + "\n")
        render_dp_sgd(runs, line)
        return
    if args.render:
        render(json.loads((DOCS / "dp.json").read_text()), earlier_stamp(DOCS / "dp.md"))
        return
    with ProcessPoolExecutor(args.workers) as pool:
        runs = list(pool.map(one_run, NOISE, [args.rounds] * len(NOISE)))
    (DOCS / "dp.json").write_text(json.dumps(runs, indent=1) + "\n")
    render(runs, line)


if __name__ == "__main__":
    main()
