"""DVFS: client energy and wall time to a fixed accuracy, for each frequency policy, through the services.

Task: hfpl on scikit-learn's digits, IID over 12 clients under 3 edges (4 each), families mlp / cnn /
cnn_deep, K = 1 local epoch, B = 32, lr 0.1, seed 0 (digits rather than MNIST: its real computation stays far
below the modelled one, which the emulation needs; the devices are modelled with the profiles' cycles per
sample of the MNIST CNN). Every client is an emulated device (FL_CLIENT_DVFS_BACKEND=emulate) with a profile
from shared/core/dvfs.py (a 3.1× spread in speed, f_max / cycles per sample, from the Zero 2 W to the Pi 4):

    --mix straggler (default): one slow device in every edge, edges of similar pace
        edge 0: rpi4, odroid-xu4-a15, rpi4, odroid-xu4-a7
        edge 1: odroid-xu4-a15, jetson-nano, rpi4, rpi-zero-2w
        edge 2: jetson-nano, odroid-xu4-a15, jetson-nano, rpi-zero-2w
    --mix ranked: a fast, a mixed and a slow edge
        edge 0: rpi4, odroid-xu4-a15, rpi4, jetson-nano
        edge 1: odroid-xu4-a15, odroid-xu4-a7, jetson-nano, rpi4
        edge 2: rpi-zero-2w, odroid-xu4-a7, rpi-zero-2w, jetson-nano

Policies: max (no DVFS), deadline (each edge's slowest client sets the pace of its others), slack (the
asynchronous policy: deadline plus the predicted wait of the edge's triple in the cloud's buffer); each with
a synchronous buffer (B = L = 3) and an asynchronous one (B = 2). Each run's wall time is emulated: every
client's result is held until its modelled time × `--scale` has passed, so "time" below is the emulated
wall time divided by the scale, in modelled seconds (it includes the services' own real overheads,
divided by the scale too). Energy is the modelled client energy of the results the cloud consumed, summed
over updates until the run first reaches the target accuracy (hfpl's: the mean of the clients' latest
held-out accuracies). Writes docs/benchmarks/energy.{md,json,png}.

    ./fl bench/energy.py [--sync-rounds 18] [--async-rounds 27] [--target 0.55] [--scale 2] [--repeats 2]
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch
from hfpl import time_to
from provenance import BENCHMARKS, stamp, stamped

from fl_services.fedctl.api import CloudAPI
from fl_services.fedctl.launch import LocalTopology
from fl_services.shared.core.config import RunConfig
from fl_services.shared.core.dvfs import PROFILES
from fl_services.shared.core.reports import RoundRecord

DOCS = BENCHMARKS
# Per edge, its four clients' devices; client k is the (k // 3)-th client of edge k mod 3.
MIXES = {
    "straggler": [["rpi4", "odroid-xu4-a15", "rpi4", "odroid-xu4-a7"],
                  ["odroid-xu4-a15", "jetson-nano", "rpi4", "rpi-zero-2w"],
                  ["jetson-nano", "odroid-xu4-a15", "jetson-nano", "rpi-zero-2w"]],
    "ranked": [["rpi4", "odroid-xu4-a15", "rpi4", "jetson-nano"],
               ["odroid-xu4-a15", "odroid-xu4-a7", "jetson-nano", "rpi4"],
               ["rpi-zero-2w", "odroid-xu4-a7", "rpi-zero-2w", "jetson-nano"]],
}


def devices_of(mix: str) -> list[str]:
    """The profile of each client id, as dvfs.profiles lists them."""
    edges = MIXES[mix]
    return [edges[k % 3][k // 3] for k in range(12)]
POLICIES = ("max", "deadline", "slack")


def config_for(policy: str, buffer_size: int, rounds: int, scale: float, devices: list[str]) -> RunConfig:
    return RunConfig.model_validate({
        "name": f"energy-{policy}-B{buffer_size}", "algorithm": "hfpl", "rounds": rounds, "seed": 0,
        "data": {"dataset": "digits", "num_clients": 12},
        "local": {"epochs": 1, "batch_size": 32, "lr": 0.1},
        "topology": {"num_edges": 3, "buffer_size": buffer_size},
        "dvfs": {"policy": policy, "profiles": devices, "time_scale": scale},
    })


def measure(api: CloudAPI, config: RunConfig, target: float, scale: float) -> dict:
    """One run to its end: its figures to the target and its history."""
    run_id = api.create_run(config).run_id
    api.action(run_id, "start")
    api.wait(run_id, timeout_s=3600)
    history = api.history(run_id)
    until = upto(history, target)
    return {
        "policy": config.dvfs.policy, "buffer_size": config.topology.buffer_size, "scale": scale,
        "updates": len(history), "final_accuracy": history[-1].test_accuracy,
        "reached": time_to(history, target) is not None, "updates_to_target": len(until),
        "time_to_target_s": until[-1].elapsed_s / scale, "energy_to_target_j": sum(h.energy_j for h in until),
        "total_energy_j": sum(h.energy_j for h in history), "total_time_s": history[-1].elapsed_s / scale,
        "history": [h.model_dump(mode="json") for h in history],
    }


def upto(history: list[RoundRecord], target: float) -> list[RoundRecord]:
    """The updates until the first one at or above the target (all of them if none is)."""
    first = next((i for i, h in enumerate(history) if h.test_accuracy >= target), len(history) - 1)
    return history[: first + 1]


def speed_spread(devices: list[str]) -> float:
    speeds = [PROFILES[d].f_max / PROFILES[d].cycles_per_sample for d in devices]
    return max(speeds) / min(speeds)


def plot(results: dict[str, list[dict]], path: Path, target: float) -> None:
    """The first repeat of each configuration."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_acc, ax_energy) = plt.subplots(1, 2, figsize=(12, 4.2), dpi=120)
    styles = {"max": "-", "deadline": "--", "slack": ":"}
    for label, repeats in results.items():
        r = repeats[0]
        history = [RoundRecord.model_validate(h) for h in r["history"]]
        t = [h.elapsed_s / r["scale"] for h in history]
        color = "tab:blue" if r["buffer_size"] == 3 else "tab:orange"
        ax_acc.plot(t, [100 * h.test_accuracy for h in history], styles[r["policy"]], color=color, label=label)
        cumulative, total = [], 0.0
        for h in history:
            total += h.energy_j
            cumulative.append(total)
        ax_energy.plot(t, cumulative, styles[r["policy"]], color=color, label=label)
    ax_acc.axhline(100 * target, color="black", lw=0.8, ls=":")
    ax_acc.set_xlabel("time (modelled s: emulated wall time / scale)")
    ax_acc.set_ylabel("mean client held-out accuracy (%)")
    ax_energy.set_xlabel("time (modelled s: emulated wall time / scale)")
    ax_energy.set_ylabel("cumulative client energy (J, modelled)")
    for ax in (ax_acc, ax_energy):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle("hfpl, 3 edges × 4 emulated devices: DVFS policies, sync (B = 3) and async (B = 2) buffer")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sync-rounds", type=int, default=18)
    parser.add_argument("--async-rounds", type=int, default=27)
    parser.add_argument("--target", type=float, default=0.55)
    parser.add_argument("--scale", type=float, default=2.0, help="emulated wall seconds per modelled second")
    parser.add_argument("--procs-per-edge", type=int, default=2)
    parser.add_argument("--mix", choices=sorted(MIXES), default="straggler")
    parser.add_argument("--repeats", type=int, default=2, help="runs of each configuration, in turn; medians")
    parser.add_argument("--from-json", type=Path, help="rewrite the table, notes and plot from a previous run's "
                        "JSON (with its arguments) instead of running")
    args = parser.parse_args()
    line = stamp()
    torch.set_num_threads(1)
    devices = devices_of(args.mix)
    runs = {f"{policy}, {'sync B = 3' if b == 3 else 'async B = 2'}": config_for(
        policy, b, args.sync_rounds if b == 3 else args.async_rounds, args.scale, devices)
        for b in (3, 2) for policy in POLICIES}
    if args.from_json:
        results = json.loads(args.from_json.read_text())["results"]
    else:
        results = run_all(args, runs)

    medians = {label: {key: statistics.median(r[key] if key in r else critical_path(r) for r in repeats)
                       for key in ("updates_to_target", "time_to_target_s", "energy_to_target_j", "final_accuracy",
                                   "critical_path_s")}
               for label, repeats in results.items()}
    rows = ["| policy | buffer | updates to target | time to target (modelled s) | vs max "
            "| slowest clients' time, Σ over updates (modelled s) | client energy to target (J) | vs max "
            "| final accuracy |", "|---|---|---|---|---|---|---|---|---|"]
    for label, m in medians.items():
        policy, buffer = label.split(", ")
        base = medians[f"max, {buffer}"]
        unreached = sum(not r["reached"] for r in results[label])
        rows.append(f"| {policy} | {buffer} | {m['updates_to_target']:g}"
                    f"{f' ({unreached} not reached)' if unreached else ''} | {m['time_to_target_s']:.1f} | "
                    f"{100 * (m['time_to_target_s'] / base['time_to_target_s'] - 1):+.1f}% | "
                    f"{m['critical_path_s']:.1f}{'' if buffer.startswith('sync') else ' (overlapping)'} | "
                    f"{m['energy_to_target_j']:.1f} | "
                    f"{100 * (m['energy_to_target_j'] / base['energy_to_target_j'] - 1):+.1f}% | "
                    f"{100 * m['final_accuracy']:.1f}% |")
    table = "\n".join(rows)
    print(table)
    write_docs(args, line, runs, devices, results, medians, table)


def critical_path(r: dict) -> float:
    """Σ over the updates to the target of the slowest consumed client's modelled time (compute + comm): the
    pure model's time to the target of a synchronous run, without the services' overheads."""
    history = [RoundRecord.model_validate(h) for h in r["history"][: r["updates_to_target"]]]
    return sum(max(c.device.compute_s + c.device.comm_s for c in h.clients if c.device) for h in history)


def run_all(args: argparse.Namespace, runs: dict[str, RunConfig]) -> dict[str, list[dict]]:
    results: dict[str, list[dict]] = {label: [] for label in runs}
    with LocalTopology(num_clients=12, num_edges=3, procs_per_edge=args.procs_per_edge,
                       extra_env={"FL_CLIENT_DVFS_BACKEND": "emulate"}) as topo,\
            CloudAPI(topo.cloud_url, topo.admin_token) as api:
        # A first run pays for loading data and warming every process: not measured.
        warm = next(iter(runs.values())).model_copy(update={"name": "warm-up", "rounds": 2})
        warm_id = api.create_run(warm).run_id
        api.action(warm_id, "start")
        api.wait(warm_id, timeout_s=3600)
        for repeat in range(args.repeats):
            for label, config in runs.items():
                r = measure(api, config, args.target, args.scale)
                results[label].append(r)
                print(f"{label:22s} #{repeat + 1}: {r['updates']} updates, final {100 * r['final_accuracy']:.1f}%; "
                      f"to {100 * args.target:.0f}%{'' if r['reached'] else ' (NOT reached: at the end)'}: "
                      f"{r['updates_to_target']} updates, {r['time_to_target_s']:.0f} s, "
                      f"{r['energy_to_target_j']:.0f} J", flush=True)
    return results


def write_docs(args: argparse.Namespace, line: str, runs: dict[str, RunConfig], devices: list[str],
               results: dict[str, list[dict]], medians: dict[str, dict], table: str) -> None:
    DOCS.mkdir(exist_ok=True)
    stem = "energy" if args.mix == "straggler" else f"energy-{args.mix}"
    plot(results, DOCS / f"{stem}.png", args.target)
    (DOCS / f"{stem}.json").write_text(json.dumps({
        "target": args.target, "scale": args.scale, "mix": args.mix, "devices": devices,
        "speed_spread": speed_spread(devices),
        "configs": {label: config.model_dump(mode="json") for label, config in runs.items()},
        "medians": medians, "results": results}, separators=(",", ":")))
    sources = "\n".join(f"- `{name}`: {PROFILES[name].source}" for name in dict.fromkeys(devices))
    edges = "\n".join(f"- edge {e}: {', '.join(d)}" for e, d in enumerate(MIXES[args.mix]))
    (DOCS / f"{stem}.md").write_text(stamped(
        f"# DVFS: client energy and time to {100 * args.target:.0f}% accuracy\n\n"
        f"Produced by `./fl bench/energy.py --sync-rounds {args.sync_rounds} --async-rounds {args.async_rounds} "
        f"--target {args.target} --scale {args.scale} --mix {args.mix}` through the services (private "
        f"redis-server, cloud, 3 edges, {3 * args.procs_per_edge} client processes). hfpl on scikit-learn's "
        f"digits, IID over 12 clients under 3 edges, families mlp / cnn / cnn_deep, K = 1, B = 32, lr 0.1, seed 0.\n\n"
        f"Every client is an emulated device ({speed_spread(devices):.1f}× spread in speed between the fastest "
        f"and the slowest; the profiles' cycles per sample are those of the MNIST CNN, so the devices compute "
        f"as if each digit cost an MNIST image). Mix `{args.mix}`:\n\n{edges}\n\nProfiles and their "
        f"sources:\n\n{sources}\n\n"
        f"**Time is modelled, not measured on devices**: each client's result is held until its modelled "
        f"time (computation c·|D|/f per epoch plus communication at 20 Mbit/s) × {args.scale} has passed; the "
        f"table gives the emulated wall time divided by that scale, which also carries the services' real "
        f"overheads (the cloud's classifier training, the real computation where it outlasts the model) "
        f"divided by it. Energy is the model's, (α/2)·c·|D|·f² + static power × time per epoch, summed over "
        f"the results the cloud consumed until the run first reached the target accuracy (the mean of the "
        f"clients' latest held-out accuracies). Each figure is the median of {args.repeats} runs (run in turn, "
        f"after a warm-up run); every run is in docs/benchmarks/{stem}.json. The column of the slowest clients' "
        f"times sums, over the updates until the target, the longest modelled time (compute + communication) "
        f"among each update's clients: a synchronous run's time under the pure model, without the services' overheads "
        f"(in an asynchronous run edge rounds overlap, so it is no time there).\n\n{table}\n\n"
        f"![accuracy and energy]({stem}.png)\n", line))


if __name__ == "__main__":
    main()
