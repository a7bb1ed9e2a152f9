"""Robust aggregation under attack: accuracy per round for FedAvg's mean and each robust aggregator.

20 clients under 2 edges (client k at edge k mod 2), MNIST 5k IID, the mlp (McMahan's 2NN), E = 1, B = 32, 10 rounds,
lr 0.1, every client every round, with the in-process reference runner (the integration tests show the
services compute the same model for each aggregator). The aggregator runs at the edges, over their 10
clients each; the cloud takes the mean of the two edges' steps.

Malicious clients are bench code, not a feature of the product: `malicious_clients` gives the reference
runner clients that train honestly and then replace their step Δ_k by an attack before they answer:

  sign_flip   −10·Δ_k
  gaussian    N(0, 1) in every coordinate (an honest step's coordinates are ~0.01)
  constant    every attacker sends the same fixed unit direction u (drawn once from the bench's seed),
              scaled to 10× the norm of its own honest step: colluding attackers pulling one way

The attackers are the lowest client ids, as many at each edge (10%: clients 0 and 1, one per edge; 20%:
clients 0–3, two per edge). Aggregators: median; trimmed_mean with β = 0.2 (drops 2 of 10 at each end);
multi-Krum with f = 2, m = 6. A run whose model goes non-finite (FedAvg's mean under a strong attack; the
cloud would stop it as diverged) counts as chance accuracy (0.1) from then on. Writes
docs/benchmarks/robust.{md,json,png}.

    ./fl python bench/robust.py [--rounds 15] [--workers 2]        the attack table
    ./fl python bench/robust.py --costs                             time and memory of each aggregator
"""
from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed

import torch
from provenance import BENCHMARKS, earlier_stamp, stamp, stamped

from fl_services.shared.core.algorithms import aggregate, robust
from fl_services.shared.core.algorithms.base import MODEL, ClientResult
from fl_services.shared.core.cloud_round import Diverged
from fl_services.shared.core.config import AggregationConfig, ModelConfig, RunConfig
from fl_services.shared.core.edge_round import ClientTask
from fl_services.shared.core.models import build_model
from fl_services.shared.core.records import encode
from fl_services.shared.core.reference import InProcessClients, run_reference
from fl_services.shared.core.reports import MAX_SCALAR
from fl_services.shared.core.seeding import torch_generator
from fl_services.shared.wire.client_edge import ClientResultHeader

DOCS = BENCHMARKS
AGGREGATORS = {
    "mean": {},
    "median": {"edge": "median"},
    "trimmed_mean": {"edge": "trimmed_mean", "trim_fraction": 0.2},
    "krum": {"edge": "krum", "krum_byzantine": 2, "krum_selected": 6},
}
# (name, attack, share of malicious clients)
SCENARIOS = [("clean", None, 0.0), ("sign_flip 20%", "sign_flip", 0.2), ("sign_flip 10%", "sign_flip", 0.1),
             ("gaussian 20%", "gaussian", 0.2), ("constant 20%", "constant", 0.2)]
BENCH_SEED = 1234
CHANCE = 0.1  # ten classes


def config(aggregator: str, rounds: int) -> RunConfig:
    return RunConfig(name=f"robust-{aggregator}", rounds=rounds, model={"name": "mlp"},
                     data={"dataset": "mnist5k", "num_clients": 20},
                     local={"epochs": 1, "batch_size": 32, "lr": 0.1},
                     topology={"num_edges": 2, "buffer_size": 2}, aggregation=AGGREGATORS[aggregator])


def attacked(attack: str, step: dict[str, torch.Tensor], client_id: int, round: int) -> dict[str, torch.Tensor]:
    """What a malicious client sends instead of its honest step."""
    if attack == "sign_flip":
        return {name: -10 * t for name, t in step.items()}
    if attack == "gaussian":
        g = torch_generator(BENCH_SEED, round, client_id)
        return {name: torch.randn(t.shape, generator=g, dtype=t.dtype) for name, t in step.items()}
    if attack == "constant":
        g = torch_generator(BENCH_SEED)  # the same direction for every attacker, every round
        direction = {name: torch.randn(t.shape, generator=g, dtype=torch.float64) for name, t in sorted(step.items())}
        length = sum(float(d.pow(2).sum()) for d in direction.values()) ** 0.5
        honest = sum(float(t.double().pow(2).sum()) for t in step.values()) ** 0.5
        return {name: (direction[name] * (10 * honest / length)).to(t.dtype) for name, t in step.items()}
    raise ValueError(attack)


def malicious_clients(attack: str, ids: frozenset[int]) -> type[InProcessClients]:
    """In-process clients of which `ids` answer with `attack` instead of their step."""

    class Malicious(InProcessClients):
        async def train(self, tasks: list[ClientTask]) -> list[ClientResult]:
            rounds = {t.client_id: t.round for t in tasks}
            # A model the attack has blown up gives losses beyond what a result may report (an edge would
            # refuse them, 422): capped here, so that the run goes on being measured.
            return [ClientResult(r.client_id, r.num_samples, r.loss if abs(r.loss) <= MAX_SCALAR else MAX_SCALAR,
                                 {MODEL: attacked(attack, r.tensors[MODEL], r.client_id, rounds[r.client_id])}
                                 if r.client_id in ids else r.tensors, r.metrics)
                    for r in await super().train(tasks)]

    return Malicious


def one_run(scenario: str, aggregator: str, rounds: int) -> dict:
    torch.set_num_threads(1)
    _, attack, share = next(s for s in SCENARIOS if s[0] == scenario)
    cfg = config(aggregator, rounds)
    ids = frozenset(range(round(share * cfg.data.num_clients)))
    started = time.perf_counter()
    clients = malicious_clients(attack, ids) if attack else InProcessClients
    try:
        accuracy = [h.test_accuracy for h in run_reference(cfg, clients=clients).history]
    except Diverged as exc:  # the model went non-finite: the rounds before, then chance (the cloud stops such a run)
        before = [h.test_accuracy for h in run_reference(cfg, exc.version - 1, clients=clients).history]
        accuracy = before + [CHANCE] * (rounds - len(before))
    return {"scenario": scenario, "aggregator": aggregator, "malicious": sorted(ids), "accuracy": accuracy,
            "seconds": time.perf_counter() - started}


def attack_table(rounds: int, workers: int) -> None:
    """Every scenario × aggregator; the tables are rewritten as runs complete (clean and sign flip first)."""
    jobs = [(s[0], a) for s in SCENARIOS for a in AGGREGATORS]
    runs: list[dict] = []
    line = stamp()
    with ProcessPoolExecutor(workers) as pool:
        for future in as_completed([pool.submit(one_run, s, a, rounds) for s, a in jobs]):
            runs.append(future.result())
            runs.sort(key=lambda r: jobs.index((r["scenario"], r["aggregator"])))
            (DOCS / "robust.json").write_text(json.dumps(runs, indent=1) + "\n")
            render(runs, line)


def final(run: dict) -> float:
    """Accuracy at the end of a run: the mean of its last three rounds (one round's wobble is not the result)."""
    return sum(run["accuracy"][-3:]) / 3


def render(runs: list[dict], line: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by = {(r["scenario"], r["aggregator"]): r for r in runs}
    if any(("clean", a) not in by for a in AGGREGATORS):
        return
    done = [s for s in SCENARIOS if all((s[0], a) in by for a in AGGREGATORS)]  # while the bench still runs
    rounds = len(runs[0]["accuracy"])
    clean_mean = final(by["clean", "mean"])
    lines = [
        "# Robust aggregation under attack",
        "",
        "Written by `bench/robust.py` (its docstring has the setup: 20 clients under 2 edges, MNIST 5k IID, mlp,",
        f"{rounds} rounds, in-process reference runner; the aggregator runs at the edges). Accuracy is the global",
        "model's on the held-out test set; *final* is the mean of the last three rounds.",
        "",
        f"| scenario | {' | '.join(AGGREGATORS)} |",
        f"|---|{'---|' * len(AGGREGATORS)}",
    ]
    for scenario, _, _ in done:
        cells = [f"{final(by[scenario, a]):.3f} ({final(by[scenario, a]) - final(by['clean', a]):+.3f})"
                 for a in AGGREGATORS]
        lines.append(f"| {scenario} | {' | '.join(cells)} |")
    lines += ["", "Final accuracy, and in brackets its difference from the same aggregator's clean run. Against the",
              f"clean run of FedAvg's mean ({clean_mean:.3f}):", ""]
    for scenario, _, _ in done[1:]:
        lines.append(f"- {scenario}: " + ", ".join(f"{a} {final(by[scenario, a]) - clean_mean:+.3f}"
                                                   for a in AGGREGATORS))
    header = " | ".join(str(i + 1) for i in range(rounds))
    lines += ["", "## Accuracy per round", "", f"| scenario | aggregator | {header} |", f"|---|---|{'---|' * rounds}"]
    for scenario, _, _ in done:
        for a in AGGREGATORS:
            lines.append(f"| {scenario} | {a} | {' | '.join(f'{x:.3f}' for x in by[scenario, a]['accuracy'])} |")
    (DOCS / "robust.md").write_text(stamped("\n".join(lines) + "\n", line))

    fig, axes = plt.subplots(1, len(done), figsize=(4 * len(done), 3.6), sharey=True, squeeze=False)
    for ax, (scenario, _, _) in zip(axes[0], done, strict=True):
        for a in AGGREGATORS:
            ax.plot(range(1, rounds + 1), by[scenario, a]["accuracy"], marker=".", label=a)
        ax.set_title(scenario)
        ax.set_xlabel("round")
        ax.set_ylim(0, 1)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("test accuracy")
    axes[0][0].legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(DOCS / "robust.png", dpi=110)
    plt.close(fig)


# ---- costs ---------------------------------------------------------------------------------------
def cost_probe(name: str, n: int, model: str) -> None:
    """One measurement in a fresh process (so ru_maxrss is this one's): prints a JSON line."""
    torch.set_num_threads(1)
    # The model alone, not the data (loading it would set a higher peak than the aggregation's).
    params = {k: p.detach() for k, p in build_model(ModelConfig(name=model), (1, 28, 28), 10).named_parameters()}
    g = torch.Generator().manual_seed(0)
    updates = [{MODEL: {k: torch.randn(t.shape, generator=g) * 0.01 for k, t in params.items()}} for _ in range(n)]
    held = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    agg = AggregationConfig(trim_fraction=0.2, krum_byzantine=max((n - 3) // 2 // 2, 0), krum_selected=max(n // 2, 1))
    started = time.perf_counter()
    if name == "mean":
        aggregate.reduce((1.0, u) for u in updates)
    else:
        robust.aggregate(name, agg, updates)
    seconds = time.perf_counter() - started
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    d = sum(t.numel() for t in params.values())
    print(json.dumps({"aggregator": name, "n": n, "model": model, "parameters": d, "seconds": seconds,
                      "updates_mib": n * d * 4 / 2**20, "extra_peak_mib": (peak - held) / 1024}))


def wire_bytes(model: str) -> dict:
    """What one client's result and one edge's contribution weigh on the wire: the same for every aggregator
    (a robust edge still sends one model-sized sum; its clients still send their whole step)."""
    params = {k: p.detach() for k, p in build_model(ModelConfig(name=model), (1, 28, 28), 10).named_parameters()}
    header = ClientResultHeader(task_id="t", client_id=0, num_samples=1, loss=0.0)
    return {"model": model, "parameters": sum(t.numel() for t in params.values()),
            "result_bytes": len(encode({MODEL: params}, header)),
            "contribution_bytes": len(encode({MODEL: {k: t.double() for k, t in params.items()}}))}


def costs() -> None:
    wire = [wire_bytes(model) for model in ("cnn", "mlp")]
    print(wire, flush=True)
    rows = []
    for model in ("cnn", "mlp"):
        for n in (10, 100):
            for name in AGGREGATORS:
                out = subprocess.run([sys.executable, __file__, "--probe", name, str(n), model], check=True,
                                     capture_output=True, text=True).stdout
                rows.append(json.loads(out.strip().splitlines()[-1]))
                print(rows[-1], flush=True)
    (DOCS / "robust-costs.json").write_text(json.dumps({"wire": wire, "aggregation": rows}, indent=1) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--costs", action="store_true")
    parser.add_argument("--render", action="store_true", help="rewrite robust.{md,png} from robust.json")
    parser.add_argument("--probe", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.probe:
        cost_probe(args.probe[0], int(args.probe[1]), args.probe[2])
    elif args.costs:
        costs()
    elif args.render:
        render(json.loads((DOCS / "robust.json").read_text()), earlier_stamp(DOCS / "robust.md"))
    else:
        attack_table(args.rounds, args.workers)


if __name__ == "__main__":
    main()
