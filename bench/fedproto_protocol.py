"""HFPL on FedProto's own MNIST protocol (Tan et al., AAAI 2022, Table 1), scaled to MNIST 5k.

The split (fl_services.shared.core.data.federated.few_shot_arrays, written as an .npz with a client index for partition
"file"): 20% of MNIST 5k held out as the test set (about 100 images per class), then 20 clients, client i
holding n_i classes with n_i uniform in {2, 3, 4, 5}, and of each of its classes c a disjoint chunk of
min(50, pool_c / clients holding c) training images (pool_c ≈ 400); every client holds out 20% of its
images as its own split for the figures it reports during the run, so about 38 shots per class train.
All clients in every round, one local epoch, mixed families (mlp / cnn / cnn_deep; client k's is the same in
every run, the families in turn over k // 3: 8 mlp, 6 cnn, 6 cnn_deep), 50 rounds, seeds 0-2 (each seed draws
the split, the initial weights and the shuffles). The optimiser is FedProto's (momentum 0.5, batch 8, lr 0.02:
the measured best, LOCAL and PARAMS below).

Runs, with the in-process reference runner (the services compute the same; tests/integration shows it):
  local only  each client's f_i (its family, its initial weights) with a private linear head, trained on its
              data alone with the same optimiser for as many epochs as the federated run gave it;
  flat        hfpl, one edge, B = 1;
  sync        hfpl, 3 edges (clients k ≡ l mod 3), B = L = 3;
  async       hfpl, 3 edges, B = 2, edge 2 three times slower (the runner's virtual time: its triples come
              every third unit and arrive stale), for the same number of cloud updates as sync.
Evaluation: every client's final f_i with the final (C̄, G) on every test image of its own classes
(FedProto's), argmax over all classes; mean ± std over clients per seed and family.

    ./fl bench/fedproto_protocol.py [--seeds 0 1 2] [--rounds 50] [--modes local flat sync async]
        [--set proto_weight=0.05 ...] [--local batch_size=8 ...] [--workers 2] [--lever LABEL] [--render]

--set and --local override hfpl's params and the local training settings; with --lever LABEL the runs become
a row of the lever table instead of the protocol's table. Writes docs/benchmarks/fedproto-protocol.{md,json,png}.
"""
from __future__ import annotations

import argparse
import json
import statistics
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

import numpy as np
import torch
from hfpl import save_figure
from provenance import BENCHMARKS, earlier_stamp, stamp, stamped

from fl_services.shared.core.algorithms import registry
from fl_services.shared.core.algorithms.hfpl import HFPL, HFPLParams, train_alone
from fl_services.shared.core.config import RunConfig
from fl_services.shared.core.data import few_shot_arrays, load_federated, own_classes_test
from fl_services.shared.core.reference import run_reference

DOCS = BENCHMARKS
DATA = Path.home() / ".cache" / "fl-datasets"
NUM_CLIENTS, SLOW_EDGE, SLOWDOWN = 20, 2, 3.0
# mode: (edges, buffer, slowdown)
MODES = {"flat": (1, 1, {}), "sync": (3, 3, {}), "async": (3, 2, {SLOW_EDGE: SLOWDOWN})}
# The protocol's measured best (docs/benchmarks/fedproto-protocol.md, "What each lever gave"): FedProto's optimiser,
# heavy-ball SGD with momentum 0.5 on batches of 8 (4x the steps of batch 32), at lr 0.02 (0.1 and 0.03 diverged).
LOCAL = {"epochs": 1, "batch_size": 8, "lr": 0.02}
PARAMS = {"momentum": 0.5}
NOTES = "<!-- notes: kept by --render -->"


def split_path(seed: int) -> Path:
    """The seed's split as an .npz (written once; a pure function of the seed)."""
    path = DATA / f"fedproto-mnist5k-{NUM_CLIENTS}-seed{seed}.npz"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp.npz")
        np.savez(tmp, **few_shot_arrays("mnist5k", NUM_CLIENTS, seed))
        tmp.replace(path)
    return path


def pinned_families(params: dict) -> list[str]:
    """Client k's family in every mode: hfpl's 3-edge assignment (the families in turn over k // 3, so every
    edge mixes them). Left to hfpl, it depends on the number of edges (flat: k mod 3), and local only would
    train another family than the 3-edge runs give client k."""
    families = params.get("families", HFPLParams.model_fields["families"].default)
    return [families[(k // MODES["sync"][0]) % len(families)] for k in range(NUM_CLIENTS)]


def protocol_config(seed: int, mode: str, rounds: int, params: dict | None = None,
                    local: dict | None = None) -> RunConfig:
    edges, buffer, _ = MODES[mode]
    params = {"client_families": pinned_families(params or {}), **(params or {})}
    return RunConfig.model_validate({
        "name": f"fedproto-{mode}", "algorithm": "hfpl", "rounds": rounds, "seed": seed,
        "data": {"dataset": "npz", "path": str(split_path(seed)), "partition": "file", "num_clients": NUM_CLIENTS},
        "local": {**LOCAL, **(local or {})},
        "topology": {"num_edges": edges, "buffer_size": buffer},
        "params": params or {},
    })


def federated(seed: int, mode: str, rounds: int, params: dict, local: dict) -> dict:
    """Per client: the final accuracy (G∘f_i) and nearest-prototype accuracy on its own classes' test
    images, and the epochs it trained."""
    torch.set_num_threads(1)
    config = protocol_config(seed, mode, rounds, params, local)
    algorithm = registry.create(config)
    run = run_reference(config, edge_slowdown=MODES[mode][2])
    epochs = dict.fromkeys(range(NUM_CLIENTS), 0)
    for record in run.history:
        for c in record.clients:
            epochs[c.client_id] += config.local.epochs
    clients = []
    for k in range(NUM_CLIENTS):
        figures = algorithm.evaluate_client(k, run.client_states.get(k, {}), run.global_state,
                                            own_classes_test(load_federated(config.data, config.seed), k))
        clients.append({"client": k, "family": algorithm.family_of(k), "epochs": epochs[k],
                        "accuracy": figures["accuracy"], "proto_accuracy": figures.get("proto_accuracy", 0.0)})
    return {"seed": seed, "mode": mode, "clients": clients,
            "curve": [h.test_accuracy for h in run.history]}


def local_only(seed: int, rounds: int, params: dict, local: dict, budgets: list[int]) -> dict:
    """Per client: its f_i with a private head trained alone, accuracy after each budget of epochs."""
    torch.set_num_threads(1)
    config = protocol_config(seed, "flat", rounds, params, local)
    algorithm: HFPL = registry.create(config)
    data = load_federated(config.data, config.seed)
    clients = []
    for k in range(NUM_CLIENTS):
        test = own_classes_test(load_federated(config.data, config.seed), k)
        at: dict[str, float] = {}

        def record(epoch: int, model: torch.nn.Module, at=at, test=test) -> None:
            if epoch in budgets:
                with torch.no_grad():
                    at[str(epoch)] = float((model(test.x).argmax(1) == test.y).float().mean())

        train_alone(algorithm, k, data.clients[k].train, max(budgets), after_epoch=record)
        clients.append({"client": k, "family": algorithm.family_of(k), "by_epochs": at})
    return {"seed": seed, "mode": "local", "clients": clients}


def parse_values(pairs: list[str]) -> dict:
    out = {}
    for pair in pairs:
        key, _, value = pair.partition("=")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


def mean_std(values: list[float]) -> tuple[float, float]:
    return statistics.mean(values), statistics.pstdev(values) if len(values) > 1 else 0.0


def pct(values: list[float]) -> str:
    m, s = mean_std(values)
    return f"{100 * m:.1f} ± {100 * s:.1f}"


def accuracies(result: dict, rounds: int, epochs: dict[int, int] | None = None) -> list[float]:
    """Per client: a federated run's final accuracy, or local only's after `rounds` epochs (or each client's
    own epochs, when given)."""
    if result["mode"] != "local":
        return [c["accuracy"] for c in result["clients"]]
    return [c["by_epochs"][str(epochs[c["client"]] if epochs else rounds)] for c in result["clients"]]


def summary(results: list[dict], rounds: int) -> dict:
    """Per mode and seed: mean accuracy; the gain over local only (same epochs per client: async clients of
    the slow edge train less); the worst client's drop below its own local-only accuracy."""
    by = {(r["seed"], r["mode"]): r for r in results}
    seeds = sorted({r["seed"] for r in results})
    modes = [m for m in ("local", "flat", "sync", "async") if (seeds[0], m) in by]
    out: dict = {"seeds": seeds, "modes": {}}
    for mode in modes:
        rows = []
        for seed in seeds:
            r = by[(seed, mode)]
            acc = accuracies(r, rounds)
            row = {"seed": seed, "mean": statistics.mean(acc)}
            if mode != "local" and (seed, "local") in by:
                epochs = {c["client"]: c["epochs"] for c in r["clients"]}
                alone = accuracies(by[(seed, "local")], rounds, epochs)
                row["local_same_epochs"] = statistics.mean(alone)
                row["gain"] = row["mean"] - row["local_same_epochs"]
                row["worst_drop"] = max(a - f for f, a in zip(acc, alone, strict=True))
            rows.append(row)
        out["modes"][mode] = {"seeds": rows, "mean": statistics.mean(r["mean"] for r in rows)}
    return out


def render_protocol(data: dict) -> str:
    results, rounds = data["results"], data["rounds"]
    s = summary(results, rounds)
    modes = list(s["modes"])
    label = {"local": "local only", "flat": "hfpl flat (L = 1, B = 1)", "sync": "3 edges, sync (B = 3)",
             "async": "3 edges, async (B = 2, edge 2 3× slower)"}
    by = {(r["seed"], r["mode"]): r for r in results}
    families = list(dict.fromkeys(c["family"] for c in results[0]["clients"]))
    table = ["| seed | family | clients | " + " | ".join(label[m] for m in modes) + " |",
             "|---|---|---|" + "---|" * len(modes)]
    for seed in s["seeds"]:
        for family in [*families, None]:
            cells = []
            for mode in modes:
                r = by[(seed, mode)]
                acc = accuracies(r, rounds)
                cells.append(pct([a for a, c in zip(acc, r["clients"], strict=True)
                                  if family is None or c["family"] == family]))
            n = sum(1 for c in by[(seed, modes[0])]["clients"] if family is None or c["family"] == family)
            name = family or "**all**"
            table.append(f"| {seed} | {name} | {n} | " + " | ".join(cells) + " |")
    table.append("| **mean of seeds** | | | " + " | ".join(f"**{100 * s['modes'][m]['mean']:.2f}**" for m in modes)
                 + " |")
    checks = ["| run | mean of seeds | gain over local only, per seed | worst client below its local only, "
              "per seed |", "|---|---|---|---|"]
    for mode in modes:
        if mode == "local":
            continue
        rows = s["modes"][mode]["seeds"]
        checks.append(f"| {label[mode]} | {100 * s['modes'][mode]['mean']:.2f}% | "
                      + ", ".join(f"{100 * r['gain']:+.2f}" for r in rows if "gain" in r) + " | "
                      + ", ".join(f"{100 * r['worst_drop']:.1f}" for r in rows if "worst_drop" in r) + " |")
    gap = ""
    if "sync" in s["modes"] and "async" in s["modes"]:
        gap = (f"\n\nAsync − sync at the same number of cloud updates ({rounds}): "
               f"{100 * (s['modes']['async']['mean'] - s['modes']['sync']['mean']):+.2f} points (mean of seeds).")
    params = json.dumps(data["params"], ensure_ascii=False) if data["params"] else "the defaults"
    return (
        "## The protocol's table\n\n"
        f"`./fl bench/fedproto_protocol.py` (seeds {', '.join(map(str, s['seeds']))}, {rounds} rounds; local "
        f"{json.dumps(data['local'])}; hfpl params {params}). Accuracy of every client on every test image of its "
        "own classes, mean ± std over clients:\n\n" + "\n".join(table) +
        "\n\nAgainst the target (≥ 97.5% mean of seeds; no client more than 1 point below its own local only; a "
        "gain on every seed). Local only is each client's own model trained alone for as many epochs as the "
        "federated run gave that client (in async, the slow edge's clients train about a third as often):\n\n"
        + "\n".join(checks) + gap + "\n")


def render_levers(levers: list[dict]) -> str:
    if not levers:
        return ""
    rows = ["| lever | setting (hfpl params; local) | seeds | rounds | local only | hfpl flat | gain |",
            "|---|---|---|---|---|---|---|"]
    for lever in levers:
        s = summary(lever["results"], lever["rounds"])
        local = s["modes"].get("local", {}).get("mean")
        flat = s["modes"].get("flat", {}).get("mean")
        cells = [f"{100 * v:.2f}%" if v is not None else "–" for v in (local, flat)]
        gain = f"{100 * (flat - local):+.2f}" if local is not None and flat is not None else "–"
        setting = ", ".join(f"{k} {v}" for k, v in lever["params"].items()) or "defaults"
        if lever["local"]:
            setting += "; " + ", ".join(f"{k} {v}" for k, v in lever["local"].items())
        rows.append(f"| {lever['label']} | {setting} | {', '.join(map(str, s['seeds']))} | {lever['rounds']} | "
                    + " | ".join(cells) + f" | {gain} |")
    return "## What each lever gave\n\n" + "\n".join(rows) + "\n"


def render(protocol: dict | None, levers: list[dict]) -> str:
    return ("# HFPL on FedProto's MNIST protocol\n\n" + (__doc__ or "").split("\n\n    ./fl")[0].strip() + "\n\n"
            + (render_protocol(protocol) + "\n" if protocol else "") + render_levers(levers)
            + "\n![accuracy over cloud updates](fedproto-protocol.png)\n")


def plot(protocol: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    colours = {"flat": "tab:blue", "sync": "tab:green", "async": "tab:orange"}
    for r in protocol["results"]:
        if r["mode"] in colours:
            ax.plot(range(1, len(r["curve"]) + 1), [100 * a for a in r["curve"]], color=colours[r["mode"]],
                    lw=1, alpha=0.8, label=f"{r['mode']}" if r["seed"] == protocol["results"][0]["seed"] else None)
    local = summary(protocol["results"], protocol["rounds"])["modes"].get("local")
    if local:
        ax.axhline(100 * local["mean"], color="grey", ls="--", lw=1, label="local only (final, own-class test)")
    ax.axhline(97.5, color="black", ls=":", lw=1, label="target 97.5%")
    late = [100 * a for r in protocol["results"] if r["mode"] in colours for a in r["curve"][len(r["curve"]) // 3:]]
    lowest = min(late)
    ax.set_ylim(max(0.0, lowest - 5), 100)
    ax.set_xlabel("cloud updates (curves: held-out splits as reported during the run)")
    ax.set_ylabel("mean of the clients' latest reports (%)")
    ax.set_title("HFPL, FedProto's MNIST protocol (20 clients, 2-5 classes each), seeds "
                 + ", ".join(str(s) for s in sorted({r["seed"] for r in protocol["results"]})), fontsize=9)
    save_figure(fig, ax, path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--modes", nargs="+", default=["local", "flat", "sync", "async"])
    parser.add_argument("--set", nargs="*", default=[], help="hfpl params, key=value (JSON values)")
    parser.add_argument("--local", nargs="*", default=[], help="local training settings, key=value")
    parser.add_argument("--workers", type=int, default=1, help="processes, one torch thread each")
    parser.add_argument("--lever", help="store the runs as a row of the lever table under this label")
    parser.add_argument("--log", help="append every finished run to this file (JSON lines)")
    parser.add_argument("--render", action="store_true", help="only rewrite the .md and .png from the .json")
    args = parser.parse_args()
    torch.set_num_threads(1)
    stored = DOCS / "fedproto-protocol.json"
    page = DOCS / "fedproto-protocol.md"
    # The page's line says when its protocol table was measured: a lever's row or a re-render keeps it.
    line = stamp() if not args.render and not args.lever else earlier_stamp(page)
    if not args.render:
        params, local = {**PARAMS, **parse_values(args.set)}, parse_values(args.local)
        for seed in args.seeds:
            split_path(seed)
        with ProcessPoolExecutor(args.workers) as pool:
            jobs = [pool.submit(local_only, seed, args.rounds, params, local, list(range(1, args.rounds + 1)))
                    if mode == "local" else pool.submit(federated, seed, mode, args.rounds, params, local)
                    for seed in args.seeds for mode in args.modes]
            for job in as_completed(jobs):
                if args.log:  # each run as it finishes: a long protocol run survives an interruption
                    with open(args.log, "a") as log:
                        log.write(json.dumps(job.result()) + "\n")
            results = [job.result() for job in jobs]
        run = {"rounds": args.rounds, "params": params, "local": {**LOCAL, **local}, "results": results}
        s = summary(results, args.rounds)
        for mode, figures in s["modes"].items():
            print(f"{mode:6s} " + "  ".join(f"seed {r['seed']}: {100 * r['mean']:.2f}"
                                            + (f" ({100 * r['gain']:+.2f})" if "gain" in r else "")
                                            for r in figures["seeds"]) + f"  mean {100 * figures['mean']:.2f}",
                  flush=True)
        # Read only now: other invocations (other levers) may have written it meanwhile.
        saved = json.loads(stored.read_text()) if stored.exists() else {"protocol": None, "levers": []}
        if args.lever:
            saved["levers"] = [x for x in saved["levers"] if x["label"] != args.lever]
            saved["levers"].append({"label": args.lever, **run})
        else:
            saved["protocol"] = run
        DOCS.mkdir(exist_ok=True)
        stored.write_text(json.dumps(saved, indent=1))
    saved = json.loads(stored.read_text())
    # Hand-written notes below the marker (measurements outside this script's runs) survive a re-render.
    notes = page.read_text().partition(NOTES)[2] if page.exists() else ""
    page.write_text(stamped(render(saved["protocol"], saved["levers"]), line) + "\n" + NOTES + notes)
    if saved["protocol"]:
        plot(saved["protocol"], DOCS / "fedproto-protocol.png")


if __name__ == "__main__":
    main()
