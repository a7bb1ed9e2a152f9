"""Many logical clients on one small host, side by side with Flower's simulation engine and the training alone.

The task: Flower's quickstart CNN (`flower_cnn`), `--samples` MNIST rows per client (drawn from mnist5k's
training rows, distinct within a client, independently across clients: the same amount of local work per
client at every size, so the model learns at every size), E = `--epochs`, B = `--batch-size`, Nesterov SGD
(lr `--lr`, momentum 0.9), synchronous FedAvg over every client for `--rounds` rounds, evaluated on mnist5k's
test rows after each round. Three systems run it, the same rows per client and the same initial weights:
- ours: one edge and two client processes (N/2 logical clients each), with the cloud and a private
  redis-server, on this host;
- Flower: bench/flower_sim.py in Flower's simulation engine (its ServerApp starts from our initial weights,
  its ClientApp loads each partition from a cache on disk by partition id), two one-CPU Ray workers at nice 0,
  run from its own venv (`--flower-venv`, built from bench/flower-requirements.txt when missing);
- reference: the in-process reference runner (shared/core/reference.py) in this process, one torch thread,
  no HTTP, no Redis: the training and evaluation alone, sequentially.
For each size, `--pairs` interleaved pairs (ours then Flower, then Flower then ours, ...), each followed by
the reference; the load average is printed before each run. s/round is the median of rounds 2+ (round 1
includes loading the data and starting the processes, Ray's included); the ratios are taken within a pair.
Memory: the peak of the summed RSS of every process of the system while it runs (sampled every 0.2 s with
psutil over all descendants of this process: for ours the cloud, the edge, the client processes and Redis; for
Flower its driver and all of Ray's processes), measured the same way on both sides.

Also, for ours: wake-up p99 (from the edge posting a round's tasks to each task being held by its client
process, from the services' log times) and /health of an edge holding `--polls` per-client long-polls.

    ./fl bench/scale.py [--sizes 10 100 500 1000] [--rounds 6] [--pairs 2] [--polls 1000] [--out docs/benchmarks]
"""
from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from datetime import datetime
from pathlib import Path

import httpx
import numpy as np
import psutil
import torch
from provenance import earlier_stamp, stamp, stamped

from fl_services.fedctl.api import CloudAPI
from fl_services.fedctl.launch import LocalTopology
from fl_services.shared.core.config import RunConfig
from fl_services.shared.core.data.builtin import bundled_pool
from fl_services.shared.core.federation import initial_model
from fl_services.shared.core.reference import run_reference

BENCH = Path(__file__).resolve().parent
REQUIREMENTS = BENCH / "flower-requirements.txt"


class Task:
    """The run's settings, shared by the three systems."""

    def __init__(self, args: argparse.Namespace):
        self.rounds, self.samples, self.epochs = args.rounds, args.samples, args.epochs
        self.batch_size, self.lr = args.batch_size, args.lr

    def config(self, num_clients: int, path: Path) -> RunConfig:
        return RunConfig(name=f"scale-{num_clients}", rounds=self.rounds, model={"name": "flower_cnn"},
                         data={"dataset": "npz", "path": str(path), "partition": "file",
                               "num_clients": num_clients, "client_holdout": 0},
                         local={"epochs": self.epochs, "batch_size": self.batch_size, "lr": self.lr,
                                "optimizer": "nesterov", "momentum": 0.9},
                         policy={"deadline_s": 1800, "min_fraction": 1.0})

    def write(self, num_clients: int, workdir: Path) -> tuple[RunConfig, Path]:
        """The data set as an npz file (ours and the reference read it) and Flower's cache (one file per
        partition, the test set, our initial weights)."""
        pool = bundled_pool("mnist5k", 0.2, 0)
        x, y = np.asarray(pool.x_train), np.asarray(pool.y_train)
        rng = np.random.default_rng(num_clients)
        rows = [rng.choice(len(y), self.samples, replace=False) for _ in range(num_clients)]
        path = workdir / f"task-{num_clients}.npz"
        path.parent.mkdir(parents=True, exist_ok=True)
        np.savez(path, x_train=x[np.concatenate(rows)], y_train=y[np.concatenate(rows)],
                 x_test=np.asarray(pool.x_test), y_test=np.asarray(pool.y_test),
                 client_train=np.repeat(np.arange(num_clients), self.samples))
        cache = workdir / f"flower-cache-{num_clients}"
        cache.mkdir(exist_ok=True)
        for k, chosen in enumerate(rows):
            np.savez(cache / f"part-{k}.npz", x=x[chosen], y=y[chosen])
        np.savez(cache / "test.npz", x=np.asarray(pool.x_test), y=np.asarray(pool.y_test))
        config = self.config(num_clients, path)
        np.savez(cache / "initial.npz", **{k: v.numpy() for k, v in initial_model(config).state_dict().items()})
        return config, cache


class PeakRss:
    """The peak of the summed RSS of every descendant of this process, sampled every 0.2 s while running;
    also the highest nice value seen among them (Flower's Ray workers must run at ours: 0)."""

    def __init__(self) -> None:
        self.peak = 0
        self.nice = 0
        self.processes = 0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()

    def _sample(self) -> None:
        me = psutil.Process()
        while not self._done.wait(0.2):
            total, count = 0, 0
            for p in me.children(recursive=True):
                try:
                    total += p.memory_info().rss
                    self.nice = max(self.nice, p.nice())
                    count += 1
                except psutil.Error:
                    pass
            self.peak = max(self.peak, total)
            self.processes = max(self.processes, count)

    @property
    def mib(self) -> float:
        return self.peak / 2**20


def per_round(ends: list[float], start: float) -> list[float]:
    marks = [start, *ends]
    return [b - a for a, b in zip(marks, marks[1:], strict=False)]


def summary(system: str, rounds_s: list[float], accuracy: list[float], **extra: float) -> dict:
    row = {"system": system, "s_per_round": statistics.median(rounds_s[1:] or rounds_s), "rounds_s": rounds_s,
           "accuracy": accuracy, **extra}
    rss = f", peak RSS {extra['rss_mib']:.0f} MiB (max nice {extra['nice']:.0f})" if "rss_mib" in extra else ""
    print(f"  {system}: {row['s_per_round']:.2f} s/round (rounds {', '.join(f'{s:.2f}' for s in rounds_s)}), "
          f"accuracy {', '.join(f'{a:.3f}' for a in accuracy)}{rss}", flush=True)
    return row


def load() -> float:
    figure = os.getloadavg()[0]
    print(f"  load average {figure:.1f} on {os.cpu_count()} cores", flush=True)
    return figure


def ours(config: RunConfig, workdir: Path, extra: dict) -> dict:
    env = {"FL_EDGE_LOG_FORMAT": "json", "FL_CLIENT_LOG_FORMAT": "json", "FL_EDGE_LOG_LEVEL": "info",
           "FL_CLIENT_LOG_LEVEL": "info"}
    n = config.data.num_clients
    started_load = load()
    with PeakRss() as rss, LocalTopology(num_clients=n, num_edges=1, procs_per_edge=2, workdir=workdir,
                                         extra_env=env) as topo, CloudAPI(topo.cloud_url, topo.admin_token) as api:
        run_id = api.create_run(config).run_id
        api.action(run_id, "start")
        info = api.wait(run_id, timeout_s=3600, poll_s=0.2)
        if info.status.value != "finished":
            raise RuntimeError(f"run {run_id} ended {info.status.value}")
        history = api.history(run_id)
        latencies = wake_ups(topo)
    # elapsed_s counts from the run's start: a round is the time between two rounds' ends.
    row = summary("ours", per_round([r.elapsed_s for r in history], 0.0), [r.test_accuracy for r in history],
                  rss_mib=rss.mib, nice=rss.nice, processes=rss.processes, load=started_load)
    extra.setdefault("wake_p99_s", p99(latencies))
    return row


def flower(python: Path, config: RunConfig, cache: Path, workers: int) -> dict:
    started_load = load()
    command = [str(python), str(BENCH / "flower_sim.py"), str(cache), "--clients", str(config.data.num_clients),
               "--rounds", str(config.rounds), "--lr", str(config.local.lr), "--batch-size",
               str(config.local.batch_size), "--epochs", str(config.local.epochs), "--optimizer",
               config.local.optimizer, "--momentum", str(config.local.momentum), "--workers", str(workers)]
    with PeakRss() as rss:
        done = subprocess.run(command, capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        raise RuntimeError(f"Flower's run failed:\n{done.stderr[-3000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return summary("Flower", per_round(result["ended"], result["started"]), result["accuracy"], rss_mib=rss.mib,
                   nice=rss.nice, processes=rss.processes, load=started_load)


def reference(config: RunConfig) -> dict:
    started_load = load()
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        history = run_reference(config).history
    finally:
        torch.set_num_threads(previous)
    return summary("reference", per_round([r.elapsed_s for r in history], 0.0), [r.test_accuracy for r in history],
                   load=started_load)


def flower_python(venv: Path) -> Path:
    """The Flower venv's python, the venv built from bench/flower-requirements.txt first where missing."""
    python = venv / "bin" / "python"
    stamp_file = venv / f".installed-{hashlib.sha256(REQUIREMENTS.read_bytes()).hexdigest()[:12]}"
    if not stamp_file.exists():
        print(f"building Flower's venv in {venv} from {REQUIREMENTS.name} ...", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        # torch's CPU build from PyTorch's index where it answers (a plain requirement pulls a CUDA build),
        # else from the default index, as ./fl installs ours.
        cpu = subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", "--timeout", "10",
                              "--retries", "0", "torch==2.13.0", "--index-url", "https://download.pytorch.org/whl/cpu"],
                             capture_output=True)
        if cpu.returncode != 0:
            print("PyTorch's CPU index is unreachable; torch from the default index", flush=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", "-r", str(REQUIREMENTS)], check=True)
        stamp_file.touch()
    return python


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


def measure(task: Task, num_clients: int, pairs: int, python: Path | None, workers: int, workdir: Path) -> dict:
    config, cache = task.write(num_clients, workdir)
    size: dict = {"clients": num_clients, "pairs": []}
    for i in range(pairs):
        print(f"N={num_clients}, pair {i + 1} of {pairs}", flush=True)
        pair: dict = {}
        order = ["ours", "Flower"] if i % 2 == 0 or python is None else ["Flower", "ours"]
        for system in order:
            if system == "ours":
                pair["ours"] = ours(config, workdir / f"n{num_clients}-p{i}", size)
            elif python is not None:
                pair["flower"] = flower(python, config, cache, workers)
        pair["reference"] = reference(config)
        pair["order"] = order
        size["pairs"].append(pair)
        ratios = [f"{key} {value:.2f}" for key, value in pair_ratios(pair).items()]
        print(f"  ratios: {', '.join(ratios)}", flush=True)
    return size


def pair_ratios(pair: dict) -> dict[str, float]:
    ratios = {"ours / reference": pair["ours"]["s_per_round"] / pair["reference"]["s_per_round"]}
    if "flower" in pair:
        ratios["ours / Flower"] = pair["ours"]["s_per_round"] / pair["flower"]["s_per_round"]
        ratios["RSS ours / Flower"] = pair["ours"]["rss_mib"] / pair["flower"]["rss_mib"]
    return ratios


def table(figures: dict) -> str:
    lines = ["| clients | pair (order) | load (ours / Flower) | ours s/round | Flower s/round | "
             "reference s/round (1 thread) | ours / Flower | ours / reference | ours peak RSS (MiB) | "
             "Flower peak RSS (MiB) | accuracy after each round: ours / Flower / reference |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for size in figures["sizes"]:
        for i, pair in enumerate(size["pairs"]):
            o, f, r = pair["ours"], pair.get("flower"), pair["reference"]
            ratios = pair_ratios(pair)

            def accuracies(row: dict | None) -> str:
                return "–" if row is None else " ".join(f"{a:.3f}" for a in row["accuracy"])

            cells = [f"{size['clients']:,}", f"{i + 1} ({' → '.join(pair['order'])})",
                     f"{o['load']:.1f}" + (f" / {f['load']:.1f}" if f else ""), f"{o['s_per_round']:.2f}",
                     f"{f['s_per_round']:.2f}" if f else "–", f"{r['s_per_round']:.2f}",
                     f"{ratios['ours / Flower']:.2f}" if f else "–", f"{ratios['ours / reference']:.2f}",
                     f"{o['rss_mib']:.0f}", f"{f['rss_mib']:.0f}" if f else "–",
                     f"{accuracies(o)} / {accuracies(f)} / {accuracies(r)}"]
            lines.append(f"| {' | '.join(cells)} |")
    lines.append("")
    for size in figures["sizes"]:
        line = f"- {size['clients']:,} clients: "
        ours_flower = [pair_ratios(p).get("ours / Flower") for p in size["pairs"]]
        ours_ref = [pair_ratios(p)["ours / reference"] for p in size["pairs"]]
        if all(x is not None for x in ours_flower):
            line += f"ours / Flower per pair {', '.join(f'{x:.2f}' for x in ours_flower)}; "
        line += f"ours / reference per pair {', '.join(f'{x:.2f}' for x in ours_ref)}"
        if "wake_p99_s" in size:
            line += f"; wake-up p99 {size['wake_p99_s'] * 1000:.0f} ms"
        lines.append(line)
    if "health" in figures:
        h = figures["health"]
        lines.append(f"- /health under {h['polls']} per-client long-polls (held by another process): p50 "
                     f"{h['health_p50_s'] * 1000:.1f} ms, p99 {h['health_p99_s'] * 1000:.1f} ms (max "
                     f"{h['health_max_s'] * 1000:.1f} ms, {h['health_n']} probes)")
    return "\n".join(lines)


READING = """\
How to read it:
- One run of this script on a shared host: the load column gives the load average when each system started
  (other work ran meanwhile and moves a system's figures by up to 2× between pairs): compare the systems within
  a pair, not across pairs.
- {equality}
- {learning}
- s/round leaves out round 1: {round_one}
- Memory is the peak of the summed RSS of every process of each system while it ran, sampled the same way on
  both sides: ours counts the cloud, the edge, two client processes and Redis (each a Python process with torch
  loaded); Flower its driver (the ServerApp) and Ray's processes (GCS, raylet, the two workers and Ray's own
  helpers).
"""


def reading(figures: dict) -> str:
    pairs = [p for s in figures["sizes"] for p in s["pairs"]]
    same = all(p["ours"]["accuracy"] == p["reference"]["accuracy"] for p in pairs)
    equality = ("Ours and the in-process reference computed the same models: their accuracies are equal round by "
                "round in every pair, as the services equal the reference runner. " if same else
                "Ours and the in-process reference did NOT compute the same models in every pair (see the "
                "accuracies). ")
    equality += ("Flower starts from the same initial weights and trains the same rows with the same optimiser, "
                 "but its DataLoader draws each client's batch order from its own generator: its accuracy differs "
                 "from ours by that batch-order difference.")
    starts = [p["flower"]["rounds_s"][0] for p in pairs if "flower" in p]
    learned = [s["clients"] for s in figures["sizes"]
               if s["pairs"][0]["ours"]["accuracy"][-1] > s["pairs"][0]["ours"]["accuracy"][0]]
    stalled = [s["clients"] for s in figures["sizes"] if s["clients"] not in learned]
    learning = (f"The model learned over the {figures['rounds']} rounds (accuracy after the last round above "
                f"the first) at {', '.join(f'{n:,}' for n in learned) or 'no size'} clients"
                + (f"; not at {', '.join(f'{n:,}' for n in stalled)}, where each round is {figures['epochs']} "
                   f"epoch(s) of {figures['samples']} samples per client: too few steps to learn in "
                   f"{figures['rounds']} rounds (more rounds or samples per client would, at a cost this shared "
                   "host could not afford at 1,000 clients)." if stalled else "."))
    round_one = (f"for Flower it includes starting Ray (about {statistics.median(starts):.0f} s here), for ours "
                 "starting\n  the processes and reading the data." if starts else
                 "for ours it includes starting the processes and reading the data (Flower did not run here:\n"
                 "  `--no-flower`).")
    return READING.format(equality=equality, learning=learning, round_one=round_one)


def document(figures: dict) -> str:
    flower = f"Flower {figures['flower_version']}" if "flower_version" in figures else "Flower not run"
    return (f"# Many logical clients on one host: ours, Flower's simulation, the training alone\n\n"
            f"Made by `bench/scale.py` ({figures['rounds']} rounds per run, {figures['samples']} samples per client, "
            f"E = {figures['epochs']}, B = {figures['batch_size']}; every figure in `scale.json`; "
            f"{flower}).\n\n{__doc__.split(chr(10) * 2)[1]}\n\n"
            f"{table(figures)}\n\n![seconds per round](scale.png)\n\n{reading(figures)}")


def plot(figures: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    sizes = figures["sizes"]
    for key, label, style in (("ours", "ours (services)", "o-"), ("flower", "Flower simulation", "s--"),
                              ("reference", "in-process reference, 1 thread", "x:")):
        points = [(s["clients"], statistics.median(p[key]["s_per_round"] for p in s["pairs"]))
                  for s in sizes if all(key in p for p in s["pairs"])]
        if points:
            ax.plot(*zip(*points, strict=True), style, label=label)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("logical clients (one host, 2 cores)")
    ax.set_ylabel("seconds per round (median over pairs)")
    ax.set_title(f"flower_cnn, {figures['samples']} samples per client: wall time per round", fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[10, 100, 500, 1000])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--pairs", type=int, default=2)
    parser.add_argument("--samples", type=int, default=8, help="training rows per client")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--lr", type=float, default=0.2)
    parser.add_argument("--flower-venv", type=Path, default=BENCH.parent / ".venv-flower",
                        help="Flower's venv (built from bench/flower-requirements.txt where missing)")
    parser.add_argument("--no-flower", action="store_true", help="ours and the reference only")
    parser.add_argument("--workers", type=int, default=2, help="Flower's Ray workers (ours: two client processes)")
    parser.add_argument("--polls", type=int, default=1000, help="per-client long-polls at /health (0: skip)")
    parser.add_argument("--health-s", type=float, default=10.0)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/fl-bench-scale"))
    parser.add_argument("--out", type=Path, default=None, help="write scale.md, scale.json and scale.png here")
    parser.add_argument("--render", action="store_true",
                        help="rewrite scale.md and scale.png in --out from its scale.json, measuring nothing")
    parser.add_argument("--hold-polls", nargs=4, metavar=("URL", "TOKEN", "POLLS", "SECONDS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.hold_polls:
        url, token, polls, seconds = args.hold_polls
        asyncio.run(hold_polls(url, token, int(polls), float(seconds)))
        return

    if args.render:
        if args.out is None:
            parser.error("--render needs --out")
        figures = json.loads((args.out / "scale.json").read_text())
        plot(figures, args.out / "scale.png")
        page = args.out / "scale.md"
        page.write_text(stamped(document(figures), earlier_stamp(page)))
        return
    torch.set_num_threads(1)
    line = stamp()
    python = None if args.no_flower else flower_python(args.flower_venv)
    figures: dict = {"rounds": args.rounds, "samples": args.samples, "epochs": args.epochs,
                     "batch_size": args.batch_size, "lr": args.lr, "cores": os.cpu_count(), "sizes": []}
    if python is not None:
        figures["flower_version"] = subprocess.run([str(python), "-c", "import flwr; print(flwr.__version__)"],
                                                   capture_output=True, text=True, check=True).stdout.strip()
    for n in sorted(args.sizes):
        figures["sizes"].append(measure(Task(args), n, args.pairs, python, args.workers, args.workdir))
    if args.polls:
        figures["health"] = health(args.polls, args.health_s, args.workdir)
    print(table(figures))
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "scale.json").write_text(json.dumps(figures, indent=2))
        plot(figures, args.out / "scale.png")
        (args.out / "scale.md").write_text(stamped(document(figures), line))
        print(f"wrote {args.out}/scale.md, scale.json and scale.png")


if __name__ == "__main__":
    main()
