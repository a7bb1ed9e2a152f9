"""Several runs on one cloud: wall time of N runs at once against the same N runs one after another.

A sweep: N FedAvg runs that differ in their learning rate (0.05, 0.1, 0.15, ...), each the MLP on
scikit-learn's digits split IID over 10 clients, E = 1, B = 16, `--rounds` rounds, all clients every round. One
topology serves both modes: cloud + 1 edge + 2 client processes (5 logical clients each), over HTTP with a
private redis-server. "sequential" creates and starts each run once the previous one has finished;
"concurrent" creates all N, starts them together and waits for the last. Both are timed from the first
start request until the last run reports finished, on warm services (one untimed run first); each repeat
times both modes, in alternating order, and the table shows medians.

    ./fl python bench/runs.py [--counts 1 2 4] [--repeats 3] [--rounds 5] [--out docs/benchmarks]
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from provenance import stamp, stamped

from fl_services.fedctl.api import CloudAPI
from fl_services.fedctl.launch import LocalTopology
from fl_services.shared.core.config import RunConfig
from fl_services.shared.core.reports import RunStatus


def sweep(count: int, rounds: int) -> list[RunConfig]:
    return [RunConfig(name=f"sweep-{k}", rounds=rounds, model={"name": "mlp"},
                      data={"dataset": "digits", "num_clients": 10},
                      local={"epochs": 1, "batch_size": 16, "lr": 0.05 * (k + 1)}) for k in range(count)]


def finished(api: CloudAPI, run_id: str) -> None:
    info = api.wait(run_id, timeout_s=900, poll_s=0.02)
    if info.status != RunStatus.finished:
        raise RuntimeError(f"run {run_id} ended {info.status.value}")


def sequential(api: CloudAPI, configs: list[RunConfig]) -> float:
    run_ids = [api.create_run(c).run_id for c in configs]
    start = time.perf_counter()
    for run_id in run_ids:
        api.action(run_id, "start")
        finished(api, run_id)
    return time.perf_counter() - start


def concurrent(api: CloudAPI, configs: list[RunConfig]) -> float:
    run_ids = [api.create_run(c).run_id for c in configs]
    start = time.perf_counter()
    for run_id in run_ids:
        api.action(run_id, "start")
    for run_id in run_ids:
        finished(api, run_id)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--counts", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path, default=None,
                        help="write runs.md and runs.json here (e.g. docs/benchmarks)")
    args = parser.parse_args()
    line = stamp()

    times: dict[int, dict[str, list[float]]] = {n: {"sequential": [], "concurrent": []} for n in args.counts}
    with LocalTopology(num_clients=10, num_edges=1, procs_per_edge=2) as topo,\
            CloudAPI(topo.cloud_url, topo.admin_token) as api:
        concurrent(api, sweep(1, 1))  # warm: data loaded in every process
        for repeat in range(args.repeats):
            for n in args.counts:
                modes = (sequential, concurrent) if repeat % 2 == 0 else (concurrent, sequential)
                for mode in modes:
                    seconds = mode(api, sweep(n, args.rounds))
                    times[n][mode.__name__].append(seconds)
                    print(f"repeat {repeat} N={n} {mode.__name__}: {seconds:.2f} s", flush=True)

    rows = []
    for n in args.counts:
        seq, conc = statistics.median(times[n]["sequential"]), statistics.median(times[n]["concurrent"])
        rows.append({"runs": n, "sequential_s": seq, "concurrent_s": conc, "ratio": conc / seq,
                     "sequential_all": times[n]["sequential"], "concurrent_all": times[n]["concurrent"]})
    figures = {"rounds": args.rounds, "repeats": args.repeats, "rows": rows}
    print(table(rows))
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "runs.json").write_text(json.dumps(figures, indent=2))
        (args.out / "runs.md").write_text(stamped(document(figures), line))
        print(f"wrote {args.out / 'runs.json'} and {args.out / 'runs.md'}")


def table(rows: list[dict]) -> str:
    lines = ["| runs N | N one after another (s) | N at once (s) | at once / one after another |",
             "|---|---|---|---|"]
    lines += [f"| {r['runs']} | {r['sequential_s']:.2f} | {r['concurrent_s']:.2f} | {r['ratio']:.2f} |" for r in rows]
    return "\n".join(lines)


def document(figures: dict) -> str:
    method = __doc__.split("\n\n")[1].replace("`--rounds`", str(figures["rounds"]))
    return (f"# Several runs on one cloud: N at once against N one after another\n\n"
            f"Made by `bench/runs.py` ({figures['repeats']} repeats, medians; every time in `runs.json`).\n\n"
            f"{method}\n\n{table(figures['rows'])}\n")


if __name__ == "__main__":
    main()
