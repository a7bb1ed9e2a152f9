"""A thousand logical clients on one small host: seconds per round, memory per logical client, wake-up latency.

The task of issue 13's comparison with Flower's simulation engine: Flower's quickstart CNN (`flower_cnn`) on
mnist5k split IID over N clients (no client rows held out), E = 1, B = 32, lr 0.05, synchronous FedAvg; one
edge and two client processes (N/2 logical clients each) on this host, with a private redis-server. For each N
and fraction (clients per round), one run of `--rounds` rounds; s/round is the median of the rounds after the first
(the first loads data and builds models, as Flower's rounds 2+ exclude its start-up).
- MiB per logical client: the client processes' and the edge's peak RSS (VmHWM) at N against the same at
  the smallest N, divided by the difference in N: what a logical client adds, data included (mnist5k is
  ~4 MB in all: the data per client is tiny).
- wake-up p99: from the edge posting a round's tasks to each task being held by its client process
  (the edge's and the clients' log times, ms resolution), over every task of the run's rounds.
- health p99: /health of an edge holding `--polls` concurrent per-client long-polls (devices that host one
  client each), asked every 20 ms for `--health-s` seconds.

With `--flower PYTHON` (a venv with flwr[simulation] and torch==2.13.0), the same task also runs in Flower's
simulation engine (bench/flower_sim.py) on the very rows each of our clients trains, for each size.

    ./fl bench/scale.py [--sizes 10 100 500 1000] [--fractions 1 0.1] [--rounds 3] [--flower PYTHON]
        [--out docs/benchmarks]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import httpx
import numpy as np
import torch
from provenance import stamp, stamped

from fl_services.fedctl.api import CloudAPI
from fl_services.fedctl.launch import LocalTopology, Service
from fl_services.shared.core.config import RunConfig
from fl_services.shared.core.data import load_federated
from fl_services.shared.core.reports import RunStatus

# Issue 13's Flower 1.41 simulation figures on this machine (s/round, rounds 2+; RSS sum), fraction 1.
FLOWER = {10: (0.76, 2.0), 50: (1.84, 2.0), 100: (2.31, 2.0), 200: (3.51, 2.0), 500: (8.21, 2.0), 1000: (16.01, 2.1)}
# Ours before this change (the same issue's table), for the plot.
BEFORE = {10: 0.74, 50: 1.91, 100: 2.85, 200: 8.05, 500: 15.69, 1000: 23.84}


SIDE_BY_SIDE = """\
Flower ran in the same invocation (`--flower`), after ours, on the very rows each of our clients trains and
our test set (bench/flower_sim.py: Flower's simulation engine, its quickstart CNN, plain SGD, two one-CPU Ray
workers, as our two client processes). Its s/round is the median of rounds 2+ (its first includes Ray's
start); its RSS is the peak over its process and Ray's. "Flower (issue 13)" and "ours before" are the issue's
figures (Flower 1.41, medians of 3, fraction 1). {load}
"""
ISSUE_ONLY = """\
Flower was not run side by side here (pass `--flower` with a Flower venv's python): its figures are issue 13's
(Flower 1.41's simulation engine on this machine, medians of 3, fraction 1), as are "ours before". {load}
"""
READING = """\

What a logical client costs, and what changed for it:
- one long-poll per client process (`POST /api/v1/clients/tasks`, client/feed.py) instead of one per logical
  client: httpx no longer scans a pool of 1,000 busy connections on every request, and the edge holds two
  waiters instead of 1,000;
- the edge's task board wakes only the waiters of the clients a post concerns (rounds wait for answers on
  their own condition), and encodes a round's shared tensors once; a bundle carries them once, each task as
  its header and a reference (500 tasks of the CNN: 1.2 MB instead of 88 MB);
- registrations go 8 at a time per process: 1,000 at once held the edge's loop for seconds;
- no state file for algorithms without client state, one file (state and result, one fsync) for the others:
  the fsync was 11 of the 25 ms a task of 5 samples cost on this disk.

Time per round still grows with the number of clients at a fixed number of samples (mnist5k is 5,000 rows
whatever N): at 1,000 clients a task trains 4-5 samples, and its fixed costs (model copy, optimizer, encoding,
the upload and the edge's check) dominate, as they do in Flower's simulation{flower_growth}. The target
"at most linear in the samples trained" is met by neither.

Accuracy after {rounds} rounds is not equal between the two{accuracies}: the task, model shape, data rows and
optimiser are the same, but the initial weights and each client's batch order come from different generators;
equal accuracy round by round would need Flower's run to take our initial model and our batch order.
"""


def config(num_clients: int, fraction: float, rounds: int) -> RunConfig:
    return RunConfig(name=f"scale-{num_clients}-{fraction}", rounds=rounds, model={"name": "flower_cnn"},
                     data={"dataset": "mnist5k", "num_clients": num_clients, "client_holdout": 0},
                     local={"epochs": 1, "batch_size": 32, "lr": 0.05}, fraction=fraction,
                     policy={"deadline_s": 600, "min_fraction": 1.0})


def flower(python: str, num_clients: int, fractions: list[float], rounds: int, workdir: Path) -> list[dict]:
    """The same task in Flower's simulation engine (bench/flower_sim.py, run by `python` of a Flower venv):
    the very rows each of our clients trains, and our test set, written to an .npz first."""
    cfg = config(num_clients, 1.0, rounds)
    data = load_federated(cfg.data, cfg.seed)
    shards = workdir / f"shards-{num_clients}.npz"
    shards.parent.mkdir(parents=True, exist_ok=True)
    np.savez(shards, x=torch.cat([c.train.x for c in data.clients]).numpy(),
             y=torch.cat([c.train.y for c in data.clients]).numpy(),
             client=np.concatenate([np.full(len(c.train.y), k) for k, c in enumerate(data.clients)]),
             x_test=data.test.x.numpy(), y_test=data.test.y.numpy())
    rows = []
    for fraction in fractions:
        done = subprocess.run([python, str(Path(__file__).with_name("flower_sim.py")), str(shards), "--rounds",
                               str(rounds), "--fraction", str(fraction), "--lr", str(cfg.local.lr)],
                              capture_output=True, text=True, timeout=1800, check=True)
        result = json.loads(done.stdout.strip().splitlines()[-1])
        ends = [result["started"], *result["ended"]]
        per_round = [b - a for a, b in zip(ends, ends[1:], strict=False)]
        rows.append({"clients": num_clients, "fraction": fraction, "s_per_round": statistics.median(per_round[1:]),
                     "rounds_s": per_round, "accuracy": result["accuracy"][-1],
                     "peak_rss_mib": result["peak_rss_mib"]})
        print(f"Flower N={num_clients} fraction={fraction}: {rows[-1]['s_per_round']:.2f} s/round (rounds "
              f"{', '.join(f'{x:.2f}' for x in per_round)}), accuracy {rows[-1]['accuracy']:.3f}, peak RSS "
              f"{result['peak_rss_mib']:.0f} MiB", flush=True)
    return rows


def peak_rss_mib(services: list[Service]) -> float:
    total = 0
    for service in services:
        assert service.proc is not None
        for line in Path(f"/proc/{service.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                total += int(line.split()[1])
    return total / 1024


def log_times(path: Path, needle: str) -> list[tuple[float, str]]:
    """(time, message) of the JSON log lines whose message contains `needle`."""
    found = []
    for line in path.read_text().splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if needle in entry.get("message", ""):
            found.append((datetime.fromisoformat(entry["time"]).timestamp(), entry["message"]))
    return found


def wake_ups(topo: LocalTopology) -> list[float]:
    """Seconds from each post of tasks to each task's receipt by its client process."""
    posts = sorted(log_times(topo.workdir / "edge0.log", "posted"))
    latencies = []
    for client in topo.clients:
        for t, message in log_times(client.log, "received"):
            post = max(((p, m) for p, m in posts if p <= t + 0.001), default=None)
            # A run's first round is left out, as in s/round: its clients are still loading their data.
            if post is not None and not post[1].endswith("version 0"):
                latencies += [max(0.0, t - post[0])] * int(message.split()[1])
    return latencies


def p99(values: list[float]) -> float:
    return sorted(values)[min(len(values) - 1, int(0.99 * len(values)))] if values else float("nan")


def measure(num_clients: int, fractions: list[float], rounds: int, workdir: Path) -> list[dict]:
    env = {"FL_EDGE_LOG_FORMAT": "json", "FL_CLIENT_LOG_FORMAT": "json", "FL_EDGE_LOG_LEVEL": "info",
           "FL_CLIENT_LOG_LEVEL": "info"}
    rows = []
    with LocalTopology(num_clients=num_clients, num_edges=1, procs_per_edge=2, workdir=workdir / f"n{num_clients}",
                       extra_env=env) as topo, CloudAPI(topo.cloud_url, topo.admin_token) as api:
        for fraction in fractions:
            run_id = api.create_run(config(num_clients, fraction, rounds)).run_id
            started = time.perf_counter()
            api.action(run_id, "start")
            info = api.wait(run_id, timeout_s=3600, poll_s=0.2)
            wall = time.perf_counter() - started
            if info.status != RunStatus.finished:
                raise RuntimeError(f"run {run_id} ended {info.status.value}")
            history = api.history(run_id)
            # elapsed_s counts from the run's start: a round is the time between two rounds' ends.
            ends = [r.elapsed_s for r in history]
            per_round = [ends[0]] + [b - a for a, b in zip(ends, ends[1:], strict=False)]
            rows.append({"clients": num_clients, "fraction": fraction, "rounds": rounds,
                         "s_per_round": statistics.median(per_round[1:] or per_round), "rounds_s": per_round,
                         "wall_s": wall, "accuracy": history[-1].test_accuracy,
                         "trained": sum(len(r.clients) for r in history) / len(history)})
            print(f"N={num_clients} fraction={fraction}: {rows[-1]['s_per_round']:.2f} s/round "
                  f"(rounds {', '.join(f'{s:.2f}' for s in per_round)}), accuracy {rows[-1]['accuracy']:.3f}",
                  flush=True)
        latencies = wake_ups(topo)
        clients_mib, edge_mib = peak_rss_mib(topo.clients), peak_rss_mib(topo.edges)
        for row in rows:
            row.update(clients_rss_mib=clients_mib, edge_rss_mib=edge_mib,
                       rss_sum_mib=clients_mib + edge_mib + peak_rss_mib(topo.clouds))
        rows[0]["wake_p99_s"] = p99(latencies)
        rows[0]["wake_max_s"] = max(latencies, default=float("nan"))
        print(f"N={num_clients}: wake-up p99 {rows[0]['wake_p99_s'] * 1000:.0f} ms over {len(latencies)} tasks; "
              f"peak RSS clients {clients_mib:.0f} MiB, edge {edge_mib:.0f} MiB", flush=True)
    return rows


async def hold_polls(url: str, token: str, polls: int, seconds: float) -> None:
    """Registers clients 0..polls-1 and holds a long-poll for each (the poller process of `health`)."""
    limits = httpx.Limits(max_connections=polls + 10, max_keepalive_connections=polls + 10)
    async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {token}"}, limits=limits,
                                 timeout=seconds + 30) as http:
        for start in range(0, polls, 100):
            await asyncio.gather(*(http.post("/api/v1/clients", json={"client_id": k})
                                   for k in range(start, min(polls, start + 100))))
        print("registered", flush=True)
        answers = await asyncio.gather(*(http.get(f"/api/v1/clients/{k}/task", params={"timeout": seconds})
                                         for k in range(polls)))
    print(f"{sum(r.status_code == 204 for r in answers)} answered 204", flush=True)


def probe_health(url: str, seconds: float) -> list[float]:
    """/health's latencies, asked every 20 ms for `seconds`."""
    latencies = []
    with httpx.Client(base_url=url, timeout=10) as probe:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            began = time.perf_counter()
            probe.get("/health").raise_for_status()
            latencies.append(time.perf_counter() - began)
            time.sleep(0.02)
    return latencies


def health(polls: int, seconds: float, workdir: Path) -> dict:
    """/health latencies while another process holds `polls` long-polls: held from this process, its own
    event loop (and the GIL) tripled the figure."""
    env = {"FL_EDGE_LONG_POLL_MAX_S": str(seconds + 10)}
    with LocalTopology(num_clients=0, num_edges=1, workdir=workdir / "health", extra_env=env) as topo:
        url = topo.edges[0].address()
        poller = subprocess.Popen([sys.executable, __file__, "--hold-polls", url, topo.client_token, str(polls),
                                   str(seconds + 5)], stdout=subprocess.PIPE, text=True)
        try:
            assert poller.stdout is not None
            if poller.stdout.readline().strip() != "registered":
                raise RuntimeError("the poller did not register its clients")
            time.sleep(2.0)  # every poll is in
            latencies = probe_health(url, seconds)
            answered = poller.stdout.readline().strip()
        finally:
            poller.kill()
            poller.wait()
    figures = {"polls": polls, "health_p99_s": p99(latencies), "health_p50_s": statistics.median(latencies),
               "health_max_s": max(latencies), "health_n": len(latencies), "polls_answered": answered}
    print(f"/health p50 {figures['health_p50_s'] * 1000:.1f} ms, p99 {figures['health_p99_s'] * 1000:.1f} ms "
          f"(max {figures['health_max_s'] * 1000:.1f} ms, {figures['health_n']} probes) under {polls} long-polls "
          f"({answered})", flush=True)
    return figures


def table(rows: list[dict], figures: dict) -> str:
    measured = {(r["clients"], r["fraction"]): r for r in figures.get("flower", [])}
    lines = ["| clients | fraction | ours s/round | Flower s/round (this run) | ours / Flower | ours accuracy | "
             "Flower accuracy | Flower s/round (issue 13) | ours before (issue 13) | our RSS sum (MiB) | "
             "Flower RSS (MiB) | wake-up p99 (ms) |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        full = r["fraction"] == 1
        theirs = measured.get((r["clients"], r["fraction"]))
        issue = FLOWER[r["clients"]][0] if full and r["clients"] in FLOWER else None
        before = BEFORE.get(r["clients"]) if full else None
        cells = [str(r["clients"]), f"{r['fraction']:g}", f"{r['s_per_round']:.2f}",
                 f"{theirs['s_per_round']:.2f}" if theirs else "–",
                 f"{r['s_per_round'] / theirs['s_per_round']:.2f}" if theirs else "–",
                 f"{r['accuracy']:.3f}", f"{theirs['accuracy']:.3f}" if theirs else "–",
                 f"{issue:.2f}" if issue else "–", f"{before:.2f}" if before else "–", f"{r['rss_sum_mib']:.0f}",
                 f"{theirs['peak_rss_mib']:.0f}" if theirs else "–",
                 f"{r['wake_p99_s'] * 1000:.0f}" if "wake_p99_s" in r else ""]
        lines.append(f"| {' | '.join(cells)} |")
    lines += ["", f"MiB per logical client beyond the smallest size (client processes + edge, peak RSS): "
                  f"{figures['mib_per_client']:.2f}"]
    if "health" in figures:
        h = figures["health"]
        lines.append(f"/health under {h['polls']} per-client long-polls (held by another process): p50 "
                     f"{h['health_p50_s'] * 1000:.1f} ms, p99 {h['health_p99_s'] * 1000:.1f} ms (max "
                     f"{h['health_max_s'] * 1000:.1f} ms, {h['health_n']} probes)")
    return "\n".join(lines)


def document(figures: dict) -> str:
    return (f"# A thousand logical clients on one host\n\nMade by `bench/scale.py` ({figures['rounds']} rounds per "
            f"run; every figure in `scale.json`).\n\n{__doc__.split(chr(10) * 2)[1]}\n\n"
            f"{table(figures['rows'], figures)}\n\n![seconds per round](scale.png)\n\n"
            f"{(SIDE_BY_SIDE if figures.get('flower') else ISSUE_ONLY).format(load=load_sentence(figures))}\n"
            f"{READING.format(**flower_comparison(figures), rounds=figures['rounds'])}")


def load_sentence(figures: dict) -> str:
    """What else the machine ran: figures move by up to 40% between runs of the same code on a shared host."""
    load, cores = figures.get("load_average"), figures.get("cores")
    if load is None:
        return ""
    return (f"Load average when the run started: {load:.1f} on {cores} cores (other work on the host moves these "
            f"figures by up to 40% between runs of the same code).")


def flower_comparison(figures: dict) -> dict[str, str]:
    """The side-by-side run's own figures for the reading below the table (empty without Flower)."""
    full = sorted((r for r in figures.get("flower", []) if r["fraction"] == 1), key=lambda r: r["clients"])
    if len(full) < 2:
        return {"flower_growth": "", "accuracies": ""}
    small, large = full[0], full[-1]
    ours = next((r for r in figures["rows"] if (r["clients"], r["fraction"]) == (small["clients"], 1)), None)
    accuracies = (f" ({ours['accuracy']:.3f} against {small['accuracy']:.3f} at {small['clients']} clients)"
                  if ours else "")
    return {"flower_growth": f" ({large['s_per_round']:.2f} s at {large['clients']:,} clients against "
                             f"{small['s_per_round']:.2f} s at {small['clients']} in the side-by-side run)",
            "accuracies": accuracies}


def plot(rows: list[dict], flower_rows: list[dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for fraction in sorted({r["fraction"] for r in rows}, reverse=True):
        chosen = [r for r in rows if r["fraction"] == fraction]
        ax.plot([r["clients"] for r in chosen], [r["s_per_round"] for r in chosen], "o-",
                label=f"ours, fraction {fraction:g}")
    for fraction in sorted({r["fraction"] for r in flower_rows}, reverse=True):
        chosen = [r for r in flower_rows if r["fraction"] == fraction]
        ax.plot([r["clients"] for r in chosen], [r["s_per_round"] for r in chosen], "s-.",
                label=f"Flower simulation, fraction {fraction:g} (this run)")
    ax.plot(list(FLOWER), [v[0] for v in FLOWER.values()], "s--", label="Flower 1.41 simulation (issue 13)")
    ax.plot(list(BEFORE), list(BEFORE.values()), "x:", label="ours before (issue 13)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("logical clients (one host, 2 cores)")
    ax.set_ylabel("seconds per round")
    ax.set_title("flower_cnn on mnist5k, E=1, B=32: wall time per round", fontsize=10)
    ax.legend(fontsize=7)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[10, 100, 500, 1000])
    parser.add_argument("--fractions", type=float, nargs="+", default=[1.0, 0.1])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--polls", type=int, default=1000, help="per-client long-polls at /health (0: skip)")
    parser.add_argument("--health-s", type=float, default=10.0)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/fl-bench-scale"))
    parser.add_argument("--flower", default=None, metavar="PYTHON",
                        help="a Flower venv's python: the same task in Flower's simulation engine, side by side")
    parser.add_argument("--out", type=Path, default=None, help="write scale.md, scale.json and scale.png here")
    parser.add_argument("--hold-polls", nargs=4, metavar=("URL", "TOKEN", "POLLS", "SECONDS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.hold_polls:
        url, token, polls, seconds = args.hold_polls
        asyncio.run(hold_polls(url, token, int(polls), float(seconds)))
        return

    line = stamp()
    load_at_start = os.getloadavg()[0]
    rows = [row for n in sorted(args.sizes) for row in measure(n, args.fractions, args.rounds, args.workdir)]
    figures: dict = {"rounds": args.rounds, "rows": rows, "load_average": load_at_start, "cores": os.cpu_count()}
    small, large = rows[0], rows[-1]
    grown = (large["clients_rss_mib"] + large["edge_rss_mib"]) - (small["clients_rss_mib"] + small["edge_rss_mib"])
    figures["mib_per_client"] = grown / max(1, large["clients"] - small["clients"])
    if args.flower:
        figures["flower"] = [row for n in sorted(args.sizes)
                             for row in flower(args.flower, n, args.fractions, args.rounds, args.workdir)]
    if args.polls:
        figures["health"] = health(args.polls, args.health_s, args.workdir)
    print(table(rows, figures))
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "scale.json").write_text(json.dumps(figures, indent=2))
        plot(rows, figures.get("flower", []), args.out / "scale.png")
        (args.out / "scale.md").write_text(stamped(document(figures), line))
        print(f"wrote {args.out}/scale.md, scale.json and scale.png")


if __name__ == "__main__":
    main()
