"""Why pFedMe took 449 s where FedAvg took 31 s on the catalogue (docs/benchmarks/catalogue.md), in gradient steps.

On the catalogue's task (MNIST 5k, Dirichlet(0.3) over 20 clients, λ = 0.25, CNN, B = 32) FedAvg trains
5 clients a round for E = 1 epoch (their ~160 training rows: 5 steps each), pFedMe trains all 20 clients
every round (its rule: the server samples S only among the answers) for R·K = 20·5 = 100 steps each. This
times each algorithm's `local_update` in this process (1 torch thread) over the clients of one round and
prints the steps, the seconds and the seconds per gradient step, so the two can be compared for the same
number of local steps.

    ./fl bench/pfedme_steps.py [--repeats 3]
"""
from __future__ import annotations

import argparse
import math
import statistics
import time

import torch

from fl_services.shared.core.algorithms import registry
from fl_services.shared.core.config import RunConfig
from fl_services.shared.core.data import load_federated
from fl_services.shared.core.federation import initial_model, local_job

TASK = {"rounds": 1, "fraction": 0.25, "seed": 0, "model": {"name": "cnn"},
        "data": {"dataset": "mnist5k", "partition": "dirichlet", "alpha": 0.3, "num_clients": 20},
        "local": {"epochs": 1, "batch_size": 32, "lr": 0.1}}


def one_round(config: RunConfig) -> tuple[int, float]:
    """(gradient steps, seconds) of every selected client's local update of round 0."""
    algorithm = registry.create(config)
    data = load_federated(config.data, config.seed)
    global_ = algorithm.init_global(initial_model(config))
    chosen = algorithm.select(config.clients_of_edge(0), 0, 0)
    steps, seconds = 0, 0.0
    for k in chosen:
        job = local_job(config, k, 0, data.clients[k])
        started = time.perf_counter()
        algorithm.local_update(job, algorithm.client_task(global_, k, 0), {})
        seconds += time.perf_counter() - started
        n, b = len(job.data.train), config.local.batch_size
        if config.algorithm == "pfedme":
            steps += algorithm.params.local_rounds * algorithm.params.inner_steps
        else:
            steps += config.local.epochs * math.ceil(n / b)
    return steps, seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    configs = {
        "fedavg": RunConfig.model_validate({**TASK, "algorithm": "fedavg"}),
        "pfedme (R=20, K=5: the catalogue's)": RunConfig.model_validate({**TASK, "algorithm": "pfedme"}),
        "pfedme (R=1, K=1)": RunConfig.model_validate({**TASK, "algorithm": "pfedme",
                                                       "params": {"local_rounds": 1, "inner_steps": 1}}),
    }
    for config in configs.values():
        one_round(config)  # warm: data and model caches
    rows = {label: [one_round(config) for _ in range(args.repeats)] for label, config in configs.items()}
    base = statistics.median(s / n for n, s in rows["fedavg"])
    print(f"{'one round of local updates':40} {'steps':>6} {'seconds':>8} {'ms/step':>8} {'per step vs fedavg':>19}")
    for label, runs in rows.items():
        steps = runs[0][0]
        seconds = statistics.median(s for _, s in runs)
        per_step = statistics.median(s / n for n, s in runs)
        print(f"{label:40} {steps:6d} {seconds:8.3f} {1000 * per_step:8.2f} {per_step / base:19.2f}")


if __name__ == "__main__":
    main()
