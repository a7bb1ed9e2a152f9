"""Overhead of the services: wall time of a distributed run / the in-process reference's, same work.

Work: FedAvg, CNN, MNIST 5k IID, 10 clients, 5 rounds, E=1, B=32. The distributed run is cloud + 1
edge + 2 client processes (5 logical clients each) over HTTP with a private redis-server; it is timed
from the start request until the run reports finished, on warm services (a first run loads the data in
each process and is reported separately as "cold"). The reference is `fl_services.shared.core.reference.run_reference`
in this process, with 1 torch thread (what each client process uses) and with all cores.

With `--metrics-overhead`, a second topology with metrics switched off (FL_CLOUD_METRICS and
FL_EDGE_METRICS false) runs beside the first (metrics on); each repeat times both, in alternating order,
and the figures include the ratio metrics on / off, each mode's spread and its ratio vs the reference.

With `--tls`, likewise a topology with every hop over TLS (LocalTopology(mutual_tls=True): HTTPS with
client certificates between the clients, the edge, the cloud and fedctl, Redis over TLS with a password),
metrics on, beside the plain one; the figures include the ratio TLS / plain of the same repeat.

    ./fl bench [--repeats 5] [--metrics-overhead] [--tls]
"""
from __future__ import annotations

import argparse
import contextlib
import statistics
import time

import httpx
import torch

from fl_services.fedctl.api import CloudAPI
from fl_services.fedctl.launch import LocalTopology
from fl_services.shared.core.config import RunConfig
from fl_services.shared.core.reference import run_reference


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


METRICS = {"on": "true", "off": "false"}


def metrics_env(mode: str) -> dict[str, str]:
    return {"FL_CLOUD_METRICS": METRICS[mode], "FL_EDGE_METRICS": METRICS[mode]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--metrics-overhead", action="store_true",
                        help="also time a topology with metrics off, interleaved, and print the on/off ratio")
    parser.add_argument("--tls", action="store_true",
                        help="also time a topology with every hop over mutual TLS, interleaved, and print the "
                             "TLS/plain ratio")
    args = parser.parse_args()
    config = RunConfig(name="overhead", rounds=args.rounds, local={"epochs": 1, "batch_size": 32})
    cores = torch.get_num_threads()
    modes = ["on", *(["off"] if args.metrics_overhead else []), *(["tls"] if args.tls else [])]
    timed_reference(config, 1)  # warm the data cache of this process

    with contextlib.ExitStack() as stack:
        apis = {}
        for mode in modes:  # each started once and kept warm; the idle one only long-polls meanwhile
            topo = stack.enter_context(LocalTopology(num_clients=10, num_edges=1, procs_per_edge=2,
                                                     extra_env=metrics_env("off" if mode == "off" else "on"),
                                                     mutual_tls=mode == "tls"))
            tls = topo.client_tls()
            apis[mode] = stack.enter_context(CloudAPI(topo.cloud_url, topo.admin_token, tls=tls))
            for url in [topo.cloud_url, *(edge.address() for edge in topo.edges)]:  # measure what is claimed
                assert url.startswith("https://" if mode == "tls" else "http://"), url
                scrape = httpx.get(f"{url}/metrics", timeout=5.0, verify=tls or True).status_code
                assert scrape == (404 if mode == "off" else 200), f"{url}/metrics answered {scrape}, mode {mode}"
        cold = {mode: timed_distributed(api, config) for mode, api in apis.items()}
        rows, runs = [], {mode: [] for mode in modes}
        for i in range(args.repeats):
            # Interleaved, so drift in the machine's load hits every side alike; the modes alternate
            # which goes first.
            for mode in modes if i % 2 == 0 else modes[::-1]:
                runs[mode].append(timed_distributed(apis[mode], config))
            dist = runs["on"][-1]
            ref1 = timed_reference(config, 1)
            refn = timed_reference(config, cores)
            rows.append((dist, ref1, refn))
            off = f"  metrics off {runs['off'][-1]:6.2f}s" if args.metrics_overhead else ""
            off += f"  tls {runs['tls'][-1]:6.2f}s" if args.tls else ""
            print(f"repeat {i + 1}: distributed {dist:6.2f}s{off}  reference(1 thread) {ref1:6.2f}s  "
                  f"reference({cores} threads) {refn:6.2f}s  ratios {dist / ref1:.3f} / {dist / refn:.3f}", flush=True)

    med = [statistics.median(col) for col in zip(*rows, strict=True)]
    ratio1 = statistics.median(d / r for d, r, _ in rows)
    ration = statistics.median(d / r for d, _, r in rows)
    print()
    print(f"work: FedAvg CNN MNIST-5k IID, 10 clients, {args.rounds} rounds, E=1 B=32; {args.repeats} repeats")
    print(f"cold distributed run (first run: processes load data): {cold['on']:.2f}s")
    print(f"median distributed {med[0]:.2f}s | reference 1 thread {med[1]:.2f}s | "
          f"reference {cores} threads {med[2]:.2f}s")
    print(f"overhead ratio (distributed / reference, median): {ratio1:.3f} vs 1-thread reference, "
          f"{ration:.3f} vs {cores}-thread reference")
    if args.metrics_overhead:
        print()
        print(f"metrics overhead (cold with metrics off: {cold['off']:.2f}s)")
        compare(runs, rows, cores, "on", "off", "metrics on / off")
    if args.tls:
        print()
        print(f"TLS overhead: every hop over mutual TLS, Redis over TLS too (cold: {cold['tls']:.2f}s)")
        compare(runs, rows, cores, "tls", "on", "TLS / plain")


def compare(runs: dict[str, list[float]], rows: list[tuple[float, float, float]], cores: int, over: str,
            under: str, label: str) -> None:
    """The two modes' times and ratios vs the reference, and `over` / `under` in the same repeat."""
    for mode in (over, under):
        times = runs[mode]
        vs1 = statistics.median(t / row[1] for t, row in zip(times, rows, strict=True))
        vsn = statistics.median(t / row[2] for t, row in zip(times, rows, strict=True))
        print(f"{mode:3}: median {statistics.median(times):.2f}s (min {min(times):.2f}s, "
              f"max {max(times):.2f}s); ratio vs 1-thread reference {vs1:.3f}, vs {cores}-thread {vsn:.3f}")
    paired = [a / b for a, b in zip(runs[over], runs[under], strict=True)]
    print(f"{label} (same repeat, median): {statistics.median(paired):.3f} "
          f"(min {min(paired):.3f}, max {max(paired):.3f}); of the medians: "
          f"{statistics.median(runs[over]) / statistics.median(runs[under]):.3f}")


if __name__ == "__main__":
    main()
