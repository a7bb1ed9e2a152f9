"""Time from LocalTopology.start() to ready (services healthy, clients registered) for a 1-edge, 2-client
topology, its services started cold (`python -m` each) and warm (forked from the forkserver), alternately;
the first warm start includes starting the forkserver. Also prints the CPU seconds the services had used by
then (/proc/PID/stat; the forkserver's own import is not in it). Usage: python bench/warm_start.py [--repeats N]"""
from __future__ import annotations

import argparse
import os
import time

from fl_services.fedctl.launch import LocalTopology
from fl_services.fedctl.warm import proc_stat


def cpu_seconds(pid: int) -> float:
    fields = proc_stat(pid)
    if fields is None:
        raise RuntimeError(f"service {pid} is gone")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def start_once(cold: bool) -> tuple[float, float]:
    began = time.monotonic()
    with LocalTopology(num_clients=2, num_edges=1, procs_per_edge=2, cold=cold) as topo:
        ready = time.monotonic() - began
        return ready, sum(cpu_seconds(p["pid"]) for p in topo.processes() if p["name"] != "redis")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    for k in range(args.repeats):
        for cold in (True, False):
            seconds, cpu = start_once(cold)
            print(f"{'cold' if cold else 'warm'} {k}: ready in {seconds:.2f} s, services' CPU {cpu:.2f} s")
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
