"""HFPL on FedProto's own MNIST protocol (Tan et al., AAAI 2022, Table 1), scaled to MNIST 5k.

The split (shared.data.datasets.few_shot_arrays, written as an .npz with a client index for partition
"file"): 20% of MNIST 5k held out as the test set (about 100 images per class), then 20 clients, client i
holding n_i classes with n_i uniform in {2, 3, 4, 5}, and of each of its classes c a disjoint chunk of
min(50, pool_c / clients holding c) training images (pool_c ≈ 400); every client holds out 20% of its
images as its own split for the figures it reports during the run, so about 38 shots per class train.
All clients in every round, one local epoch, mixed families (mlp / cnn / cnn_deep), 50 rounds, seeds 0-2
(each seed draws the split, the initial weights and the shuffles).

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
        [--set proto_weight=0.05 ...] [--local batch_size=8 ...] [--workers 2] [--levers] [--render]

--set and --local override hfpl's params and the local training settings (exploration); --levers measures
the lever table (each lever off against the chosen configuration); writes docs/fedproto-protocol.{md,json,png}
unless --no-write.
"""
from __future__ import annotations

import argparse
import json
import statistics
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import torch
from hfpl import train_with_head

from shared.algorithms import registry
from shared.algorithms.hfpl import HFPL
from shared.config import RunConfig
from shared.data.datasets import ArrayDataset, few_shot_arrays, load_federated
from shared.reference import run_reference

DOCS = Path(__file__).resolve().parent.parent / "docs"
DATA = Path.home() / ".cache" / "fl-datasets"
NUM_CLIENTS, SLOW_EDGE, SLOWDOWN = 20, 2, 3.0
# mode: (edges, buffer, slowdown)
MODES = {"flat": (1, 1, {}), "sync": (3, 3, {}), "async": (3, 2, {SLOW_EDGE: SLOWDOWN})}
LOCAL = {"epochs": 1, "batch_size": 32, "lr": 0.1}


def split_path(seed: int) -> Path:
    """The seed's split as an .npz (written once; a pure function of the seed)."""
    path = DATA / f"fedproto-mnist5k-{NUM_CLIENTS}-seed{seed}.npz"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp.npz")
        np.savez(tmp, **few_shot_arrays("mnist5k", NUM_CLIENTS, seed))
        tmp.replace(path)
    return path


def protocol_config(seed: int, mode: str, rounds: int, params: dict | None = None,
                    local: dict | None = None) -> RunConfig:
    edges, buffer, _ = MODES[mode]
    return RunConfig.model_validate({
        "name": f"fedproto-{mode}", "algorithm": "hfpl", "rounds": rounds, "seed": seed,
        "data": {"dataset": "npz", "path": str(split_path(seed)), "partition": "file", "num_clients": NUM_CLIENTS},
        "local": {**LOCAL, **(local or {})},
        "topology": {"num_edges": edges, "buffer_size": buffer},
        "params": params or {},
    })


def own_classes_test(config: RunConfig, k: int) -> ArrayDataset:
    """Every test image of the classes client k holds."""
    data = load_federated(config.data, config.seed)
    classes = torch.cat([data.clients[k].train.y, data.clients[k].test.y]).unique()
    keep = torch.isin(data.test.y, classes)
    return ArrayDataset(data.test.x[keep], data.test.y[keep])


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
                                            own_classes_test(config, k))
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
        test = own_classes_test(config, k)
        at: dict[str, float] = {}

        def record(epoch: int, model: torch.nn.Module, at=at, test=test) -> None:
            if epoch in budgets:
                with torch.no_grad():
                    at[str(epoch)] = float((model(test.x).argmax(1) == test.y).float().mean())

        train_with_head(algorithm, config, k, data.clients[k].train, max(budgets), after_epoch=record)
        clients.append({"client": k, "family": algorithm.family_of(k), "by_epochs": at})
    return {"seed": seed, "mode": "local", "clients": clients}


def parse_values(pairs: list[str]) -> dict:
    out = {}
    for pair in pairs:
        key, _, value = pair.partition("=")
        out[key] = json.loads(value) if value[:1] in "[{0123456789-tfn" else value
    return out


def mean_std(values: list[float]) -> tuple[float, float]:
    return statistics.mean(values), statistics.pstdev(values) if len(values) > 1 else 0.0


def pct(values: list[float]) -> str:
    m, s = mean_std(values)
    return f"{100 * m:.2f} ± {100 * s:.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--modes", nargs="+", default=["local", "flat", "sync", "async"])
    parser.add_argument("--set", nargs="*", default=[], help="hfpl params, key=value (JSON values)")
    parser.add_argument("--local", nargs="*", default=[], help="local training settings, key=value")
    parser.add_argument("--workers", type=int, default=1, help="processes, one torch thread each")
    parser.add_argument("--no-write", action="store_true", help="print only, leave docs/ alone")
    args = parser.parse_args()
    torch.set_num_threads(1)
    params, local = parse_values(args.set), parse_values(args.local)
    for seed in args.seeds:
        split_path(seed)
    jobs = []
    with ProcessPoolExecutor(args.workers) as pool:
        for seed in args.seeds:
            for mode in args.modes:
                if mode == "local":
                    jobs.append(pool.submit(local_only, seed, args.rounds, params, local,
                                            sorted({args.rounds, *range(1, args.rounds + 1)})))
                else:
                    jobs.append(pool.submit(federated, seed, mode, args.rounds, params, local))
        results = [job.result() for job in jobs]
    by = {(r["seed"], r["mode"]): r for r in results}
    for seed in args.seeds:
        line = [f"seed {seed}:"]
        for mode in args.modes:
            r = by[(seed, mode)]
            if mode == "local":
                accs = [c["by_epochs"][str(args.rounds)] for c in r["clients"]]
            else:
                accs = [c["accuracy"] for c in r["clients"]]
            line.append(f"{mode} {pct(accs)}")
        print("  ".join(line), flush=True)
    if not args.no_write:
        DOCS.mkdir(exist_ok=True)
        (DOCS / "fedproto-protocol.json").write_text(json.dumps(
            {"rounds": args.rounds, "params": params, "local": {**LOCAL, **local}, "results": results}, indent=1))


if __name__ == "__main__":
    main()
