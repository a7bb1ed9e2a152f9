"""Overhead of the services: wall time of a distributed run / the in-process reference's, same work.

Work: FedAvg, CNN, MNIST 5k IID, 10 clients, 5 rounds, E=1, B=32. The distributed run is cloud + 1
edge + 2 client processes (5 logical clients each) over HTTP with a private redis-server; it is timed
from the start request until the run reports finished, on warm services (a first run loads the data in
each process and is reported separately as "cold"). The reference is `shared.reference.run_reference`
in this process, with 1 torch thread (what each client process uses) and with all cores.

    ./fl bench [--repeats 5]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from fedctl.api import CloudAPI
from fedctl.launch import LocalTopology
from shared.config import RunConfig
from shared.reference import run_reference


def timed_distributed(api: CloudAPI, config: RunConfig) -> float:
    run_id = api.create_run(config).run_id
    start = time.perf_counter()
    api.action(run_id, "start")
    api.wait(run_id, timeout_s=900, poll_s=0.02)
    return time.perf_counter() - start


def timed_reference(config: RunConfig, threads: int) -> float:
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        start = time.perf_counter()
        run_reference(config)
        return time.perf_counter() - start
    finally:
        torch.set_num_threads(previous)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    config = RunConfig(name="overhead", rounds=args.rounds, local={"epochs": 1, "batch_size": 32})
    cores = torch.get_num_threads()
    timed_reference(config, 1)  # warm the data cache of this process

    with LocalTopology(num_clients=10, num_edges=1, procs_per_edge=2) as topo, \
            CloudAPI(topo.cloud_url, topo.admin_token) as api:
        cold = timed_distributed(api, config)
        rows = []
        for i in range(args.repeats):
            # Interleaved, so drift in the machine's load hits both sides alike.
            dist = timed_distributed(api, config)
            ref1 = timed_reference(config, 1)
            refn = timed_reference(config, cores)
            rows.append((dist, ref1, refn))
            print(f"repeat {i + 1}: distributed {dist:6.2f}s  reference(1 thread) {ref1:6.2f}s  "
                  f"reference({cores} threads) {refn:6.2f}s  ratios {dist / ref1:.3f} / {dist / refn:.3f}", flush=True)

    med = [statistics.median(col) for col in zip(*rows, strict=True)]
    ratio1 = statistics.median(d / r for d, r, _ in rows)
    ration = statistics.median(d / r for d, _, r in rows)
    print()
    print(f"work: FedAvg CNN MNIST-5k IID, 10 clients, {args.rounds} rounds, E=1 B=32; {args.repeats} repeats")
    print(f"cold distributed run (first run: processes load data): {cold:.2f}s")
    print(f"median distributed {med[0]:.2f}s | reference 1 thread {med[1]:.2f}s | "
          f"reference {cores} threads {med[2]:.2f}s")
    print(f"overhead ratio (distributed / reference, median): {ratio1:.3f} vs 1-thread reference, "
          f"{ration:.3f} vs {cores}-thread reference")


if __name__ == "__main__":
    main()
