"""What federated evaluation costs a device: `evaluate_held_out` (the global model on its held-out split) against
its `local_update` (one epoch), on the demo's task (CNN, MNIST 5k over 10 clients, B = 32, 1 torch thread).

Each of the 10 clients evaluates and trains version 0 in this process; prints, per client, its training and held-out
sample counts and the median seconds of each over `--repeats`, then the ratio of the totals (read the ratio of one
run: on a shared machine the absolute figures move with the load).

    ./fl bench/federated_evaluation.py [--repeats 3]
"""
from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import torch

from fl_services.shared.core.algorithms import registry
from fl_services.shared.core.config import RunConfig
from fl_services.shared.core.data import load_federated
from fl_services.shared.core.federation import evaluate_held_out, initial_model, local_job

TASK = {"model": {"name": "cnn"}, "data": {"dataset": "mnist5k", "num_clients": 10},
        "local": {"epochs": 1, "batch_size": 32}, "evaluation": "both"}


def median_seconds(fn: Callable[[], Any], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    config = RunConfig.model_validate(TASK)
    algorithm = registry.create(config)
    data = load_federated(config.data, config.seed)
    task = algorithm.client_task(algorithm.init_global(initial_model(config)), 0, 0)
    totals = [0.0, 0.0]
    print(f"{'client':>6} {'train':>6} {'held-out':>8} {'evaluate s':>10} {'train s':>8}")
    for k, client in enumerate(data.clients):
        job = local_job(config, k, 0, client)
        evaluate_s = median_seconds(partial(evaluate_held_out, algorithm, job, task), args.repeats)
        train_s = median_seconds(partial(algorithm.local_update, job, task, {}), args.repeats)
        totals[0] += evaluate_s
        totals[1] += train_s
        print(f"{k:>6} {len(client.train):>6} {len(client.test):>8} {evaluate_s:>10.4f} {train_s:>8.4f}")
    print(f"evaluation / local update, all clients: {totals[0]:.3f} s / {totals[1]:.3f} s = "
          f"{totals[0] / totals[1]:.3f}")


if __name__ == "__main__":
    main()
