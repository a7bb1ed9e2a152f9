"""How far can federation lift a client above training alone on this task? HFPL against two bounds.

Same task as bench/hfpl.py (MNIST 5k, Dirichlet(0.3) over 12 clients under 3 edges, families mlp / cnn /
cnn_deep mixed within every edge, K = 1, B = 32, lr 0.1, λ_p = 0.05, d = 64), for several partition
seeds, with the in-process reference runner (synchronous, B = L = 3; the integration tests show the
services compute the same). For every client, on its own held-out split (skewed like its training data):

  local only   its f_i with a private linear head, trained on its data alone for the same epochs;
  federated    its f_i after the HFPL run with the final G (the issue's evaluation);
  pooled       one model per family (from the initial weights of that family's first client) trained on
               the union of all clients' training data (no federation, no privacy) for the same number of
               epochs, about 12× an average client's steps: what the data could give these models if it
               were pooled;
  pooled+prior the pooled model's logits shifted by log π_i(y) − log π(y), the client's own label
               prior against the pooled one (Bayes' rule under label shift): the pooled model told
               what the client's data looks like.

pooled+prior − local only is the headroom a federated method has on this task. Also: each method's
errors on classes the client has fewer than RARE training samples of, and on the others; and the
federated − local difference after fewer epochs. Writes docs/benchmarks/hfpl-headroom.{md,json}.

    ./fl bench/hfpl_headroom.py [--seeds 0 1 2] [--rounds 30] [--workers 2] [--render]
"""
from __future__ import annotations

import argparse
import json
import statistics
from concurrent.futures import ProcessPoolExecutor
from functools import partial

import torch
from hfpl import config_for
from provenance import BENCHMARKS, earlier_stamp, stamp, stamped

from fl_services.shared.core.algorithms import registry
from fl_services.shared.core.algorithms.hfpl import HFPL, train_alone
from fl_services.shared.core.client_reports import client_reports
from fl_services.shared.core.config import RunConfig
from fl_services.shared.core.data import ArrayDataset, load_federated
from fl_services.shared.core.reference import run_reference

DOCS = BENCHMARKS
RARE = 10  # a class the client has fewer training samples of than this is rare for it
METHODS = ("local only", "federated", "pooled", "pooled+prior")


def seeded(seed: int, rounds: int) -> RunConfig:
    return RunConfig.model_validate({**config_for("hfpl-headroom", 3, rounds).model_dump(), "seed": seed})


def budgets(rounds: int) -> list[int]:
    return sorted({e for e in (1, 2, 5, 10, 20) if e < rounds} | {rounds})


def predictions(part: str, seed: int, rounds: int) -> dict[str, dict]:
    """Predicted labels on every client's held-out split, by method, for one part of the work; and
    the mean held-out accuracy over clients after each budget of epochs ("by budget")."""
    torch.set_num_threads(1)
    config = seeded(seed, rounds)
    algorithm: HFPL = registry.create(config)
    data = load_federated(config.data, config.seed)
    clients = range(config.data.num_clients)
    out: dict[str, dict] = {}
    with torch.no_grad():
        if part == "federated":
            with torch.enable_grad():
                result = run_reference(config, rounds)
            global_ = result.global_state
            g = torch.nn.Linear(global_["classifier.weight"].shape[1], global_["classifier.weight"].shape[0])
            g.weight.copy_(global_["classifier.weight"])
            g.bias.copy_(global_["classifier.bias"])
            out["federated"] = {}
            for k in clients:
                f = algorithm.client_model(k, result.client_states[k], tuple(data.input_shape)).eval()
                out["federated"][k] = g(f(data.clients[k].test.x)).argmax(1).tolist()
            # Sync: every client trains once per round, so after n rounds each has had n epochs; its
            # report is its f_i after training with the G it had received.
            out["by budget"] = {"federated": {
                e: statistics.mean(r["accuracy"] for r in client_reports(result.history[:e]).values())
                for e in budgets(rounds)}}
        elif part == "local only":
            out["local only"] = {}
            at: dict[int, list[float]] = {e: [] for e in budgets(rounds)}

            def record(epoch: int, model: torch.nn.Module, test) -> None:
                if epoch in at:
                    with torch.no_grad():
                        at[epoch].append(float((model(test.x).argmax(1) == test.y).float().mean()))

            for k in clients:
                test = data.clients[k].test
                with torch.enable_grad():
                    model = train_alone(algorithm, k, data.clients[k].train, rounds * config.local.epochs,
                                        after_epoch=partial(record, test=test))
                out["local only"][k] = model(test.x).argmax(1).tolist()
            out["by budget"] = {"local only": {e: statistics.mean(v) for e, v in at.items()}}
        else:  # pooled: one model per family, from the initial weights of that family's first client
            pooled = ArrayDataset(torch.cat([c.train.x for c in data.clients]),
                                  torch.cat([c.train.y for c in data.clients]))
            prior_all = class_prior(pooled.y, data.num_classes)
            out["pooled"], out["pooled+prior"] = {}, {}
            first: dict[str, int] = {}
            for k in clients:
                first.setdefault(algorithm.family_of(k), k)
            for family, k0 in first.items():
                with torch.enable_grad():
                    model = train_alone(algorithm, k0, pooled, rounds * config.local.epochs)
                for k in clients:
                    if algorithm.family_of(k) == family:
                        logits = model(data.clients[k].test.x)
                        shift = class_prior(data.clients[k].train.y, data.num_classes).log() - prior_all.log()
                        out["pooled"][k] = logits.argmax(1).tolist()
                        out["pooled+prior"][k] = (logits + shift).argmax(1).tolist()
    return out


def class_prior(labels: torch.Tensor, num_classes: int) -> torch.Tensor:
    """Label frequencies with one pseudo-count per class (a class the client lacks is unlikely, not impossible)."""
    counts = torch.bincount(labels, minlength=num_classes).double() + 1
    return counts / counts.sum()


def summarise(seed: int, rounds: int, preds: dict[str, dict[int, list[int]]],
              by_budget: dict[str, dict[int, float]]) -> dict:
    config = seeded(seed, rounds)
    algorithm: HFPL = registry.create(config)
    data = load_federated(config.data, config.seed)
    rows = []
    rare_errors, other_errors = dict.fromkeys(METHODS, 0), dict.fromkeys(METHODS, 0)
    for k in range(config.data.num_clients):
        truth = data.clients[k].test.y
        rare = torch.bincount(data.clients[k].train.y, minlength=data.num_classes)[truth] < RARE
        row = {"client": k, "family": algorithm.family_of(k), "train": len(data.clients[k].train),
               "held_out": len(truth), "held_out_rare": int(rare.sum())}
        for m in METHODS:
            wrong = torch.tensor(preds[m][k]) != truth
            row[m] = 1.0 - float(wrong.float().mean())
            rare_errors[m] += int((wrong & rare).sum())
            other_errors[m] += int((wrong & ~rare).sum())
        rows.append(row)
    return {"seed": seed, "clients": rows, "mean": {m: statistics.mean(r[m] for r in rows) for m in METHODS},
            "by_budget": {m: {str(e): a for e, a in curve.items()} for m, curve in by_budget.items()},
            "errors_rare": rare_errors, "errors_other": other_errors}


def render(seeds: list[dict], rounds: int) -> str:
    """docs/benchmarks/hfpl-headroom.md from the per-seed summaries (also what the JSON holds)."""
    def pct(x: float) -> str:
        return f"{100 * x:.1f}%"

    table = ["| seed | " + " | ".join(METHODS) + " | federated − local | headroom (pooled+prior − local) |",
             "|---" * (len(METHODS) + 3) + "|"]
    for s in seeds:
        m = s["mean"]
        table.append(f"| {s['seed']} | " + " | ".join(pct(m[k]) for k in METHODS) +
                     f" | {100 * (m['federated'] - m['local only']):+.1f} | "
                     f"{100 * (m['pooled+prior'] - m['local only']):+.1f} |")
    overall = {k: statistics.mean(s["mean"][k] for s in seeds) for k in METHODS}
    gain = overall["federated"] - overall["local only"]
    headroom = overall["pooled+prior"] - overall["local only"]
    table.append("| **mean** | " + " | ".join(f"**{pct(overall[k])}**" for k in METHODS) +
                 f" | **{100 * gain:+.1f}** | **{100 * headroom:+.1f}** |")
    families = ["| family | clients | " + " | ".join(METHODS) + " |", "|---" * (len(METHODS) + 2) + "|"]
    for family in dict.fromkeys(c["family"] for s in seeds for c in s["clients"]):
        group = [c for s in seeds for c in s["clients"] if c["family"] == family]
        families.append(f"| {family} | {len(group)} | " +
                        " | ".join(pct(statistics.mean(c[k] for c in group)) for k in METHODS) + " |")
    clients = [c for s in seeds for c in s["clients"]]
    held_rare = sum(c["held_out_rare"] for c in clients)
    held_other = sum(c["held_out"] for c in clients) - held_rare
    errors = [f"| method | errors on rare classes ({held_rare} held-out samples) | "
              f"errors on the other classes ({held_other}) |", "|---|---|---|"]
    for k in METHODS:
        errors.append(f"| {k} | {sum(s['errors_rare'][k] for s in seeds)} | "
                      f"{sum(s['errors_other'][k] for s in seeds)} |")
    steps = list(seeds[0]["by_budget"]["federated"])
    curve = ["| epochs per client | " + " | ".join(f"seed {s['seed']}" for s in seeds) + " | mean difference |",
             "|---" * (len(seeds) + 2) + "|"]
    for e in steps:
        pairs = [(s["by_budget"]["federated"][e], s["by_budget"]["local only"][e]) for s in seeds]
        curve.append(f"| {e} | " + " | ".join(f"{100 * f:.1f} vs {100 * a:.1f} ({100 * (f - a):+.1f})"
                                               for f, a in pairs) +
                     f" | **{100 * statistics.mean(f - a for f, a in pairs):+.1f}** |")
    return (
        "# How far can federation lift a client on this task?\n\n"
        "Produced by `./fl bench/hfpl_headroom.py` (in-process reference runner, synchronous B = L = 3, "
        f"{rounds} rounds, K = 1; task as in [hfpl.md](hfpl.md): MNIST 5k, Dirichlet(0.3) over 12 clients "
        "under 3 edges, families mlp / cnn / cnn_deep; seeds "
        f"{', '.join(str(s['seed']) for s in seeds)}, each drawing the partition, the initial weights and the "
        "shuffles). Mean over clients of the accuracy on each client's own "
        "held-out split:\n\n"
        "- **local only**: the client's f_i with a private linear head, trained alone for the same epochs;\n"
        "- **federated**: the client's f_i after the HFPL run, with the final G (the issue's evaluation);\n"
        "- **pooled**: one model per family (from the initial weights of that family's first client) trained "
        f"on all clients' training data pooled (no federation, no privacy) for the same {rounds} epochs, about "
        "12× an average client's steps;\n"
        "- **pooled+prior**: the pooled model's logits shifted by log π_i(y) − log π(y), the client's own "
        "label prior against the pooled one (Bayes' rule under label shift).\n\n"
        "pooled+prior − local only is the headroom: what these models could gain over training alone if "
        f"the clients' data were simply pooled. HFPL gains {100 * gain:+.1f} points of a headroom of "
        f"{100 * headroom:+.1f}.\n\n" + "\n".join(table) +
        "\n\n## Per family (all seeds)\n\n" + "\n".join(families) +
        "\n\n## Where the errors are (all seeds)\n\n"
        f"A held-out sample is of a rare class when its client has fewer than {RARE} training samples of that "
        "class.\n\n" + "\n".join(errors) +
        "\n\n## Federated against local only, by budget\n\n"
        "Mean held-out accuracy over clients after e epochs each: federated is each client's report after its "
        "e-th round (its f_i after training, with the G it had received), local only the same model trained "
        "alone for e epochs.\n\n" + "\n".join(curve) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--workers", type=int, default=2, help="processes, one torch thread each")
    parser.add_argument("--render", action="store_true", help="only rewrite the .md from the stored .json")
    args = parser.parse_args()
    stored = DOCS / "hfpl-headroom.json"
    if args.render:
        saved = json.loads(stored.read_text())
        page = DOCS / "hfpl-headroom.md"
        page.write_text(stamped(render(saved["seeds"], saved["rounds"]), earlier_stamp(page)))
        return
    line = stamp()
    parts = [(part, seed) for seed in args.seeds for part in ("federated", "local only", "pooled")]
    preds: dict[int, dict[str, dict]] = {seed: {} for seed in args.seeds}
    by_budget: dict[int, dict[str, dict[int, float]]] = {seed: {} for seed in args.seeds}
    with ProcessPoolExecutor(args.workers) as pool:
        futures = {pool.submit(predictions, part, seed, args.rounds): (part, seed) for part, seed in parts}
        for future, (part, seed) in futures.items():
            result = future.result()
            by_budget[seed].update(result.pop("by budget", {}))
            preds[seed].update(result)
            print(f"seed {seed}: {part} done", flush=True)
    seeds = [summarise(seed, args.rounds, preds[seed], by_budget[seed]) for seed in args.seeds]
    DOCS.mkdir(exist_ok=True)
    stored.write_text(json.dumps({"rounds": args.rounds, "rare": RARE, "seeds": seeds}, indent=1))
    text = render(seeds, args.rounds)
    (DOCS / "hfpl-headroom.md").write_text(stamped(text, line))
    print(text)


if __name__ == "__main__":
    main()
