"""Synchronous against buffered asynchronous averaging (FedBuff) at the cloud and at the edge, in virtual time.

FedAvg, the CNN on MNIST 5k (IID), 3 sites × N devices (client k at site k mod 3), E = 1, B = 32, lr 0.1, every
device every round, with the in-process reference runner in virtual time (`run_reference(device_time=True)`):
an edge round takes its slowest answering device's modelled time at full speed (shared/core/dvfs.py), and the
cloud updates when its buffer is full. The tests show the services compute the same updates for the same
buffers (tests/federation/test_buffered.py). Devices (≥ 3× speed spread):

  site 0  Raspberry Pi 4 and ODROID-XU4 big cores, alternately        (3.7–3.8 ms per sample)
  site 1  Pi 4s and a Jetson Nano, its last device a Pi Zero 2 W      (one slow device, 11.5 ms)
  site 2  Pi Zero 2 Ws and ODROID-XU4 LITTLE cores, alternately       (the straggler site, 9.9–11.5 ms)

Variants: sync (B = 3, every answer); async-cloud (B = 2: the cloud updates with the first two sites' steps, each
weighted by FedBuff's 1/√(1 + τ)); async-edge (B = 3, each edge round closed at its N − 1 first answers, the
last dropped); async-both (both); async-edge-join and async-both-join (the late answer kept and sent with the
edge's next contribution, weighted by its own staleness: policy.late = 'join'); and DVFS's policies (sync-deadline,
async-both-join-deadline, async-both-join-slack: each device at the frequencies the edge's pacing budget lets it
pick, modelled in virtual time; energy is not counted here); and levers on async-both-join's cloud update
(-eta0.7: η_s = 0.7; -const: s(τ) = 1). Each run sets at least W = 9·R client tasks (a task set to a device counts
whether its answer is used or dropped). Per variant, over its seeds: medians of the modelled time and client tasks
until the global model first reaches the target accuracy; at equal work W = 90 (10 synchronous rounds, the targets'
measure) and W = 9·R, the accuracy of the last global model published once W tasks were set (one update) and the
mean over the models published during the last 27 tasks (3 rounds' work), each beside its difference to sync on
the same seed (mean ± standard error); and that one-update difference at every round's work. Writes
docs/benchmarks/async.{md,json,png}; a run measures the variants it is given (by default sync, async-both-join
and its two levers) and keeps the stored runs of the others (virtual time and accuracy are deterministic given the
seed, not measured on the machine).

    ./fl python bench/async.py [--devices 3] [--rounds 10] [--target 0.85] [--seeds 0 … 9] [--workers 2]
                               [--variants async-both-join ...]
    ./fl python bench/async.py --render          rewrite async.{md,png} from async.json
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Any, NamedTuple

import torch
from provenance import BENCHMARKS, stamp

from fl_services.shared.core.config import RunConfig
from fl_services.shared.core.reference import run_reference

DOCS = BENCHMARKS
SITES = 3
PROFILES = [["rpi4", "odroid-xu4-a15"], ["rpi4", "jetson-nano"], ["rpi-zero-2w", "odroid-xu4-a7"]]
# Per variant: B, whether edge rounds close at N − 1 answers, what becomes of the late one, DVFS's policy.


class Variant(NamedTuple):
    buffer: int  # B, of the 3 sites
    edge_async: bool  # edge rounds close at N − 1 answers
    late: str  # what becomes of the late answer (policy.late)
    dvfs: str  # DVFS's policy
    settings: dict[str, Any] = {}  # RunConfig fields over the benchmark's own (a lever: η_s, s(τ))


VARIANTS = {"sync": Variant(3, False, "drop", "max"), "async-cloud": Variant(2, False, "drop", "max"),
            "async-edge": Variant(3, True, "drop", "max"), "async-both": Variant(2, True, "drop", "max"),
            "async-edge-join": Variant(3, True, "join", "max"), "async-both-join": Variant(2, True, "join", "max"),
            "sync-deadline": Variant(3, False, "drop", "deadline"),
            "async-both-join-deadline": Variant(2, True, "join", "deadline"),
            "async-both-join-slack": Variant(2, True, "join", "slack"),
            # Levers on async-both-join's cloud update (FedBuff tunes η_s; s(τ) constant or steeper than FedBuff's).
            "async-both-join-eta0.7": Variant(2, True, "join", "max", {"server_lr": 0.7}),
            "async-both-join-const": Variant(2, True, "join", "max",
                                             {"topology": {"staleness": {"function": "constant"}}}),
            }
# What a plain run measures (the others keep their stored runs: --variants reruns them).
DEFAULT = ("sync", "async-both-join", "async-both-join-eta0.7", "async-both-join-const")
EQUAL = 10  # the targets' equal client work: that of 10 synchronous rounds
WINDOW = 3  # rounds of work the windowed accuracy averages over: about one cycle of async-both-join's updates


def profile(client_id: int, devices: int) -> str:
    site, index = client_id % SITES, client_id // SITES
    if site == 1 and index == devices - 1:
        return "rpi-zero-2w"  # site 1's one slow device
    return PROFILES[site][index % 2]


def merged(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """`base` with `over`'s fields, nested dicts merged field by field."""
    return {**base, **{k: merged(base[k], v) if isinstance(v, dict) and isinstance(base.get(k), dict) else v
                       for k, v in over.items()}}


def config_for(variant: str, devices: int, updates: int, seed: int) -> RunConfig:
    v = VARIANTS[variant]
    clients = SITES * devices
    return RunConfig.model_validate(merged({
        "name": variant, "rounds": updates, "seed": seed, "model": {"name": "cnn"},
        "data": {"dataset": "mnist5k", "num_clients": clients},
        "local": {"epochs": 1, "batch_size": 32, "lr": 0.1},
        "topology": {"num_edges": SITES, "buffer_size": v.buffer},
        "policy": {"answers": devices - 1 if v.edge_async else None, "late": v.late},
        "dvfs": {"policy": v.dvfs, "clients": {k: {"profile": profile(k, devices)} for k in range(clients)}},
    }, v.settings))


def one_run(variant: str, devices: int, rounds: int, seed: int) -> dict:
    torch.set_num_threads(1)
    v = VARIANTS[variant]
    work = SITES * devices * rounds
    # Enough updates to set W tasks: each sets about B·N (its consumed edges restart on N devices each), or, joining
    # late answers, at least B·(N − 1) (a device whose late answer is not sent yet gets no task).
    updates = math.ceil(work / (v.buffer * (devices - 1 if v.late == "join" else devices))) + 1
    started = time.perf_counter()
    result = run_reference(config_for(variant, devices, updates, seed), device_time=True)
    return {"variant": variant, "seed": seed, "work": work, "seconds": time.perf_counter() - started,
            "accuracy": [h.test_accuracy for h in result.history], "time": result.virtual_times,
            "tasks": result.client_tasks}


def at(run: dict, work: int) -> float:
    """The accuracy of the last global model published once `work` tasks were set (NaN: the run stopped before)."""
    if run["tasks"][-1] < work:
        return math.nan
    return next(a for a, t in zip(reversed(run["accuracy"]), reversed(run["tasks"]), strict=True) if t <= work)


def windowed(run: dict, work: int, width: int) -> float:
    """The mean accuracy of the global models published while the last `width` of `work` tasks were set."""
    if run["tasks"][-1] < work:
        return math.nan
    return statistics.mean(a for a, t in zip(run["accuracy"], run["tasks"], strict=True) if work - width < t <= work)


def fallback(run: dict, work: int) -> float:
    """How far the accuracy falls back from one published model to the next (0 where it rises), on average over the
    updates published during the second half of `work` tasks: the scatter that progress does not explain."""
    if run["tasks"][-1] < work:
        return math.nan
    pairs = list(zip(run["accuracy"], run["accuracy"][1:], run["tasks"][1:], strict=False))
    return statistics.mean(max(0.0, a - b) for a, b, t in pairs if work / 2 < t <= work)


def reached(run: dict, target: float) -> tuple[float, float]:
    """Modelled seconds and client tasks until the global model first reaches `target` (inf: never)."""
    first = next((i for i, a in enumerate(run["accuracy"]) if a >= target), None)
    return (math.inf, math.inf) if first is None else (run["time"][first], run["tasks"][first])


def seeds_of(runs: list[dict], variant: str) -> list[int]:
    return sorted(r["seed"] for r in runs if r["variant"] == variant)


def paired(runs: list[dict], variant: str, measure: Any) -> tuple[float, float, int]:
    """The variant's difference to sync in points, per seed both ran: mean, its standard error, and how many."""
    sync = {r["seed"]: r for r in runs if r["variant"] == "sync"}
    gaps = [100 * (measure(r) - measure(sync[r["seed"]])) for r in runs
            if r["variant"] == variant and r["seed"] in sync]
    gaps = [g for g in gaps if not math.isnan(g)]
    if not gaps:
        return math.nan, math.nan, 0
    return statistics.mean(gaps), statistics.stdev(gaps) / math.sqrt(len(gaps)) if len(gaps) > 1 else math.nan, \
        len(gaps)


def speed(runs: list[dict], target: float) -> list[dict]:
    """Per variant, medians over its seeds of time and tasks to the target; speed-up against sync's median over the
    same seeds."""
    rows = []
    for variant in [v for v in VARIANTS if v in {r["variant"] for r in runs}]:
        seeds = seeds_of(runs, variant)
        mine = [reached(r, target) for r in runs if r["variant"] == variant]
        sync = [reached(r, target)[0] for r in runs if r["variant"] == "sync" and r["seed"] in seeds]
        seconds = statistics.median(t for t, _ in mine)
        base = statistics.median(sync) if len(sync) == len(seeds) else math.nan
        rows.append({"variant": variant, "seeds": seeds, "time": seconds,
                     "tasks": statistics.median(n for _, n in mine),
                     "speedup": base / seconds if math.isfinite(seconds) and math.isfinite(base) else math.nan})
    return rows


def accuracy(runs: list[dict], work: int, width: int) -> list[dict]:
    """Per variant at `work` tasks: the median of one update's accuracy and of the windowed mean, and each one's
    paired difference to sync."""
    rows = []
    for variant in [v for v in VARIANTS if v in {r["variant"] for r in runs}]:
        mine = [r for r in runs if r["variant"] == variant]
        if all(r["work"] < work for r in mine):
            continue
        rows.append({"variant": variant, "seeds": seeds_of(runs, variant),
                     "one": statistics.median(at(r, work) for r in mine),
                     "one_gap": paired(runs, variant, lambda r: at(r, work)),
                     "window": statistics.median(windowed(r, work, width) for r in mine),
                     "window_gap": paired(runs, variant, lambda r: windowed(r, work, width)),
                     "fallback": statistics.median(fallback(r, work) for r in mine)})
    return rows


def shown(value: float, fmt: str) -> str:
    return "not reached" if math.isinf(value) else "—" if math.isnan(value) else format(value, fmt)


def gap(g: tuple[float, float, int]) -> str:
    return "—" if not g[2] else f"{g[0]:+.2f} ± {shown(g[1], '.2f')}"


def seed_list(seeds: list[int]) -> str:
    return f"{seeds[0]}–{seeds[-1]}" if seeds == list(range(seeds[0], seeds[-1] + 1)) and len(seeds) > 2 \
        else ", ".join(map(str, seeds))


def render(data: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")

    runs, target, devices = data["runs"], data["target"], data["devices"]
    per_round = SITES * devices
    equal, longest, width = EQUAL * per_round, max(r["work"] for r in runs), WINDOW * per_round
    speeds = {r["variant"]: r for r in speed(runs, target)}
    lines = [f"| variant | seeds | rounds' work run | modelled s to {target:.0%} | speed-up | client tasks to "
             f"{target:.0%} |", "| --- | --- | --- | --- | --- | --- |"]
    for r in speeds.values():
        work = {x["work"] for x in runs if x["variant"] == r["variant"]}
        lines.append(f"| {r['variant']} | {seed_list(r['seeds'])} | {', '.join(str(w // per_round) for w in work)} | "
                     f"{shown(r['time'], '.1f')} | {shown(r['speedup'], '.2f')}× | {shown(r['tasks'], '.0f')} |")
    speed_table = "\n".join(lines)
    tables, verdicts = [], {}
    for work in sorted({equal, longest}):
        rows = accuracy(runs, work, width)
        lines = [f"| variant | seeds | one update at {work} tasks | against sync, paired | mean over tasks "
                 f"{work - width + 1}–{work} | against sync, paired | fall-back, tasks {work // 2 + 1}–{work} |",
                 "| --- | --- | --- | --- | --- | --- | --- |"]
        for r in rows:
            lines.append(f"| {r['variant']} | {seed_list(r['seeds'])} | {shown(100 * r['one'], '.2f')}% | "
                         f"{gap(r['one_gap'])} | {shown(100 * r['window'], '.2f')}% | {gap(r['window_gap'])} | "
                         f"{shown(100 * r['fallback'], '.2f')} |")
            verdicts[r["variant"], work] = r
        tables.append("\n".join(lines))
    print(speed_table, *tables, sep="\n\n")

    def against(name: str) -> str:
        row, one, win = speeds[name], verdicts[name, equal]["one_gap"], verdicts[name, equal]["window_gap"]
        later = verdicts.get((name, longest)) if longest > equal else None
        text = (f"{name} (seeds {seed_list(row['seeds'])}) is {shown(row['speedup'], '.2f')}× faster than sync to "
                f"{target:.0%} ("
                f"{'met' if row['speedup'] >= 2 else 'not met'}); at {equal} tasks its accuracy is {gap(one)} points "
                f"from sync's in one update ({'met' if one[0] >= -0.5 else 'not met'}) and {gap(win)} over the "
                f"last {width} tasks ({'met' if win[0] >= -0.5 else 'not met'})")
        if later:
            text += (f", at {longest} tasks {gap(later['one_gap'])} in one update and {gap(later['window_gap'])} "
                     "over the window")
        return text

    named = [n for n in ("async-both", "async-both-join") if n in speeds]
    shown_over = [n for n in VARIANTS if n != "sync" and seeds_of(runs, n) == seeds_of(runs, "sync")]
    verdict = ("Against the targets (≥ 2× faster to the same accuracy; within 0.5 points of sync's accuracy at equal "
               "client work, read as a paired mean difference no lower than −0.5): "
               + "; ".join(against(n) for n in named) + ".")
    measured = "\n\n".join(f"> {line.removeprefix('> ').rstrip('.')}: {', '.join(vs)}."
                          for line, vs in by_stamp(data["measured"]).items())
    dvfs = "\n\n".join(f"**DVFS `{policy}`.** {note(runs, policy, target)}" for policy in ("deadline", "slack")
                        if f"async-both-join-{policy}" in speeds)
    page = (f"# Buffered asynchronous averaging (FedBuff) at the cloud and the edge\n\n"
            f"Measured, per variant (virtual time and accuracy depend on the seed, not on the machine):\n\n"
            f"{measured}\n\n"
            f"FedAvg, CNN, MNIST 5k (IID), 3 sites × {devices} emulated devices (bench/async.py's docstring "
            f"has the profiles: a straggler site and one slow device, ≥ 3× speed spread), E = 1, B = 32, lr 0.1, "
            f"η_s = 1, s(τ) = 1/√(1 + τ) but where a variant's name says otherwise (-eta0.7: η_s = 0.7; -const: "
            f"s = 1), in the reference runner's virtual time (modelled device seconds at the frequencies the "
            f"variant's DVFS policy picks: full speed but in the -deadline and -slack variants). Asynchronous at "
            f"the cloud: B = 2 of 3; at the edge: K = N − 1 of N; -join: the late answer joins the edge's next "
            f"contribution (policy.late). Every seed a variant lists is reported (none dropped). Speed-up: sync's "
            f"median modelled time to {target:.0%} over the same seeds, over the variant's.\n\n{speed_table}\n\n"
            f"Accuracy at equal client work W = {equal} tasks ({EQUAL} synchronous rounds, the targets' measure)"
            + (f" and, for the runs that set them, {longest}" if longest > equal else "")
            + ": the accuracy of the last global model published once W tasks were set (one update, the median over "
            f"seeds), and the mean accuracy of the models published while "
            f"the last {width} tasks of W were set ({WINDOW} synchronous rounds' work); beside each, the variant's "
            f"difference to sync on the same seed in points, mean ± standard error over the seeds; fall-back: how "
            f"far the accuracy falls from one published model to the next (0 where it rises), in points, on average "
            f"over the updates published during the second half of W (median over seeds).\n\n"
            + "\n\n".join(tables) + f"\n\n{verdict}\n\n{EXPLAINED}\n\n{over_work(runs, per_round)}\n\n"
            f"{per_seed(runs, equal)}\n\n{dvfs}\n\n![accuracy over modelled time and client tasks](async.png)\n\n"
            "Not measured here: the services' own overheads (the cloud update, transfers), which virtual time leaves "
            "out, and DVFS's energy (the DVFS benchmark's subject).\n")
    (DOCS / "async.md").write_text(page)
    plot(runs, target, devices, shown_over)


# Why the figures are what they are (what the levers and the cycle of updates do is measured above, not assumed).
EXPLAINED = (
    "Where the time goes: a synchronous round waits for the straggler site's slowest device (a Pi Zero 2 W, 11.5 ms "
    "a sample). Buffering at the cloud lets the two fast sites update without it, its steps coming in stale and "
    "shrunk by s(τ); closing edge rounds at K = N − 1 takes the slow device of site 1 off the critical path, but "
    "not the straggler site's, whose second fastest device is as slow as its slowest. Dropping the late answer "
    "wastes a third of the tasks an edge sets; joining it spends that work on a step the cloud weighs by its own "
    "staleness, which is why async-both-join needs fewer client tasks to the target than any other variant, sync "
    "included, and reaches it fastest.\n\n"
    "Its accuracy at equal work is another matter. An asynchronous update averages the steps of 4 to 6 devices (two "
    "sites' N − 1 answers, and the late answers they carry), some computed on an older model, where a synchronous "
    "round averages all 9; with E = 1 and lr 0.1 one device's step moves the model far, so the asynchronous model's "
    "accuracy falls back more often and further from one update to the next (fall-back, above). And the updates "
    "come in a cycle that is the same for every seed (the devices' modelled times decide it: which two sites meet "
    "in the buffer, when the late answers join): the fastest site is in every update, its two fastest devices "
    "training each time, and the straggler site's steps come every third update. So how async-both-join's model "
    "compares with sync's at W depends on where in that cycle W falls: ahead of sync at some W, behind at others "
    "(the table below). W = 90 falls at the end of a stretch, from about 60 tasks, in which its model makes no "
    "progress on average over the seeds while sync's still climbs; the next update that brings the straggler "
    "site's steps (92 tasks) lifts it level with sync again. The mean over the last 3 rounds' work spans most of a "
    "cycle, so it depends less on where W falls; the gap it leaves is smaller than one update's, but not within "
    "0.5 points. Neither lever closes it: a smaller server step (-eta0.7) scatters less but "
    "learns slower, losing the speed-up, and undamped stale steps (-const, s = 1) scatter more; FedBuff's s(τ) at "
    "η_s = 1 is the better of the three on both targets. B and K have no other asynchronous values with 3 sites "
    "of 3 devices: B = 3 with K = 2 is async-edge-join, B = 2 with every answer async-cloud, neither 2× faster.")


def by_stamp(measured: dict[str, str]) -> dict[str, list[str]]:
    """The variants each measuring command's line covers, in VARIANTS' order."""
    lines: dict[str, list[str]] = {}
    for variant in [v for v in VARIANTS if v in measured]:
        lines.setdefault(measured[variant], []).append(variant)
    return lines


def over_work(runs: list[dict], per_round: int) -> str:
    """The one-update difference to sync at every synchronous round's work both ran, for the variants run on sync's
    seeds: where in the asynchronous variants' cycle of updates W falls moves it."""
    seeds = seeds_of(runs, "sync")
    names = [v for v in VARIANTS if v != "sync" and seeds_of(runs, v) == seeds]
    longest = min(r["tasks"][-1] for r in runs if r["variant"] == "sync")
    lines = ["| W (tasks) | " + " | ".join(names) + " |", "| --- |" + " --- |" * len(names)]
    for work in range(per_round * (EQUAL // 2), longest + 1, per_round):
        lines.append(f"| {work} | " + " | ".join(gap(paired(runs, n, lambda r, w=work: at(r, w))) for n in names)
                     + " |")
    return (f"One update's accuracy against sync's at each W, paired, mean ± standard error over seeds "
            f"{seed_list(seeds)} (points):\n\n" + "\n".join(lines))


def per_seed(runs: list[dict], work: int) -> str:
    """Each variant's one-update accuracy at `work` tasks, per seed: how far the single updates scatter."""
    seeds = sorted({r["seed"] for r in runs})
    lines = [f"| one update at {work} tasks | " + " | ".join(f"seed {s}" for s in seeds) + " |",
             "| --- |" + " --- |" * len(seeds)]
    for variant in [v for v in VARIANTS if any(r["variant"] == v for r in runs)]:
        by_seed = {r["seed"]: at(r, work) for r in runs if r["variant"] == variant}
        lines.append(f"| {variant} | " + " | ".join(shown(100 * by_seed.get(s, math.nan), ".1f") for s in seeds)
                     + " |")
    return "\n".join(lines)


def note(runs: list[dict], policy: str, target: float) -> str:
    """Where a DVFS policy lands against async-both-join at full speed, over the policy's seeds."""
    seeds = seeds_of(runs, f"async-both-join-{policy}")
    mine = [r for r in runs if r["seed"] in seeds]
    rows = {r["variant"]: r for r in speed(mine, target)}
    base, row = rows["async-both-join"], rows[f"async-both-join-{policy}"]
    change = 100 * (row["time"] / base["time"] - 1) if math.isfinite(row["time"]) and math.isfinite(base["time"]) \
        else math.nan
    equal = min(r["work"] for r in mine)
    accuracy = statistics.median(at(r, equal) for r in mine if r["variant"] == row["variant"])
    return (f"Over seeds {seed_list(seeds)}, async-both-join-{policy} reaches {target:.0%} in "
            f"{shown(row['time'], '.1f')} modelled s, {shown(change, '+.1f')}% against async-both-join at full speed "
            f"on the same seeds, and {shown(100 * accuracy, '.2f')}% in one update at {equal} tasks. "
            + DVFS_WHY[policy])


def plot(runs: list[dict], target: float, devices: int, names: list[str]) -> None:
    """Seed 0 over modelled time; the mean over seeds over client tasks (the variants run on sync's seeds)."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for variant in ["sync", *names]:
        first = next(r for r in runs if r["variant"] == variant and r["seed"] == 0)
        axes[0].plot(first["time"], first["accuracy"], label=variant)
        mine = [r for r in runs if r["variant"] == variant]
        tasks = sorted({t for r in mine for t in r["tasks"]})
        mean = [statistics.mean(at({**r, "work": t}, t) for r in mine) for t in tasks]
        axes[1].plot(tasks, mean, label=variant)
    axes[0].set_title("seed 0")
    axes[1].set_title(f"mean over seeds {seed_list(seeds_of(runs, 'sync'))}: the last model published by W")
    for ax, xlabel in zip(axes, ("modelled seconds", "client tasks set (W)"), strict=True):
        ax.axhline(target, color="grey", lw=0.5)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("test accuracy")
        ax.set_ylim(0.5, 1.0)
        ax.legend(fontsize=8)
    fig.suptitle(f"FedAvg, CNN, MNIST 5k, 3 sites × {devices} devices")
    fig.tight_layout()
    fig.savefig(DOCS / "async.png", dpi=100)


DVFS_WHY = {
    "deadline": (
        "An edge gives its round's tasks a budget, D = the slowest selected device's full-speed time, only once it "
        "has heard every one of them (shared/core/pacing.py, the edge's own rule), and the faster ones slow down to "
        "meet it. Closing at K = N − 1, the late device's answer never closes a round, so the edge never hears it "
        "and every round that sets it a task runs at full speed; the rounds in which it is busy (its late answer "
        "not sent yet) close with all their answers, at D, the slower device's own full-speed time. So in virtual "
        "time, where every device meets its budget and nothing else takes time, `deadline` changes no round's "
        "length: it lands on async-both-join's figures exactly, saving energy at no modelled time. The services "
        "measured +7.6% wall time for `deadline` at B = 2 in their own setup (docs/benchmarks/energy.md: no "
        "K-of-N, its own devices); in this model a budget costs no time, so such a cost comes from what the model "
        "leaves out (transfers, the services' overheads, budgets met in wall time)."),
    "slack": (
        "`slack` adds to D the time the edge's last contribution waited in the cloud's buffer for the other one "
        "(B = 2; cloud.orchestrator's buffer waits, here in modelled time), less what its devices already ran "
        "beyond D: the fast site that came first slows down to come with the other. That moves when each "
        "contribution arrives, so the buffers, and with them the accuracies, differ from async-both-join's."),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--devices", type=int, default=3, help="N: devices per site")
    parser.add_argument("--rounds", type=int, default=EQUAL, help="R: each run sets the client work of R synchronous "
                        f"rounds (at least {EQUAL}, the targets' equal work)")
    parser.add_argument("--target", type=float, default=0.85)
    parser.add_argument("--seeds", type=int, nargs="+", default=list(range(10)))
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(DEFAULT),
                        help="run these, keeping the stored runs of the others (same devices and target)")
    parser.add_argument("--render", action="store_true", help="rewrite async.{md,png} from async.json")
    args = parser.parse_args()
    if args.render:
        render(json.loads((DOCS / "async.json").read_text()))
        return
    if args.rounds < EQUAL:
        parser.error(f"--rounds is at least {EQUAL}: the targets' accuracy is read at that work")
    line = stamp()
    stored = json.loads((DOCS / "async.json").read_text()) if (DOCS / "async.json").exists() else None
    kept: list[dict] = []
    measured: dict[str, str] = {}
    if stored is not None:
        if (stored["devices"], stored["target"]) != (args.devices, args.target):
            raise SystemExit(f"the stored runs are of {stored['devices']} devices and target {stored['target']}: "
                             "move docs/benchmarks/async.json away to run anew")
        kept = [r for r in stored["runs"] if r["variant"] not in args.variants]
        measured = {v: m for v, m in stored["measured"].items() if v not in args.variants}
    with ProcessPoolExecutor(args.workers) as pool:
        futures = [pool.submit(one_run, v, args.devices, args.rounds, s) for s in args.seeds for v in args.variants]
        runs = kept + [f.result() for f in futures]
    data = {"target": args.target, "devices": args.devices, "runs": runs,
            "measured": {**measured, **{v: line for v in args.variants}}}
    (DOCS / "async.json").write_text(json.dumps(data, indent=1))
    render(data)


if __name__ == "__main__":
    main()
