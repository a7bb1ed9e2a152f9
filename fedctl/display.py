"""What fedctl shows in a terminal: a run's history as a table (live while it trains), its final summary."""
from __future__ import annotations

import itertools
import math
import time
from pathlib import Path

from rich import box
from rich.console import Console
from rich.live import Live
from rich.table import Table

from fl_services.fedctl.api import CloudAPI
from fl_services.fedctl.report import save_results
from fl_services.shared.core.client_reports import client_reports, group_summary
from fl_services.shared.core.reports import RoundRecord, RunStatus
from fl_services.shared.wire.admin import RunInfo

console = Console()


def _figure(x: float, fmt: str) -> str:
    """A figure, or – for one not evaluated yet (NaN, null in JSON)."""
    return "–" if math.isnan(x) else format(x, fmt)


def run_title(info: RunInfo) -> str:
    return (f"run {info.run_id} · {info.config.algorithm} · {info.status.value} · version {info.version}/"
            f"{info.rounds} · dvfs {info.config.dvfs.policy}")


def site_names(api: CloudAPI, info: RunInfo) -> dict[int, str]:
    """A run over registered sites: its sites' names by edge id, as the registry knows them (a simulated
    federation's edges have numbers only: none)."""
    if info.config.selection is None:
        return {}
    return {site.edge_id: site.name for site in api.run_sites(info.run_id).sites if site.name is not None}


def history_table(history: list[RoundRecord], title: str, last: int | None = None,
                  names: dict[int, str] | None = None) -> Table:
    """One row per cloud update, numbered by the history's round (from 0, as the dashboard and the CSV number
    them); its edges by site name where `names` (edge id -> name) has one; energy is the modelled client energy
    (DVFS) of the update and of the run so far (– for a run that models no device: not measured); failed: selected
    clients that did not answer (reported they could not train, went offline or timed out); elapsed: since the
    run started, as the history's elapsed_s."""
    names = names or {}
    # Units in the headers and a light box: the ten columns fit an 80-column terminal without wrapping.
    table = Table(title=title, box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, collapse_padding=True)
    for col in ("round", "clients", "failed", "edges", "train loss", "test loss", "test acc", "elapsed", "energy J",
                "total J"):
        table.add_column(col, justify="right")
    cumulative = list(itertools.accumulate(h.energy_j or 0.0 for h in history))
    for h, total in list(zip(history, cumulative, strict=True))[-last if last else 0:]:
        energy = ("–", "–") if h.energy_j is None else (f"{h.energy_j:.1f}", f"{total:.1f}")
        table.add_row(str(h.round), str(len(h.clients)), str(len(h.failed_clients)),
                      ",".join(names.get(e, str(e)) for e in h.edges),
                      _figure(h.train_loss, ".4f"), _figure(h.test_loss, ".4f"),
                      _figure(100 * h.test_accuracy, ".2f") + "%" * (not math.isnan(h.test_accuracy)),
                      f"{h.elapsed_s:.1f}s", *energy)
    return table


def failures(history: list[RoundRecord]) -> list[str]:
    """Each client that failed a round: the kind and what it reported last, and in how many rounds it failed."""
    latest: dict[int, tuple[int, str, str, int]] = {}
    for h in history:
        for f in h.failed_clients:
            count = latest.get(f.client_id, (0, "", "", 0))[3] + 1
            latest[f.client_id] = (h.round, f.kind, f.error, count)
    return [f"client {k} failed {n} round(s) ({kind}), last in round {r}: {' '.join(error.split())}"
            for k, (r, kind, error, n) in sorted(latest.items())]


def show_results(info: RunInfo, history: list[RoundRecord], names: dict[int, str] | None = None) -> None:
    console.print(history_table(history, run_title(info), names=names))
    show_why(info, history)


def show_why(info: RunInfo, history: list[RoundRecord]) -> None:
    """Why the run stopped short (devices that never came, every device failed, …) and its clients' failures.
    Devices' own words among them: printed as they are, never read as Rich markup (a '[/]' would stop fedctl)."""
    if info.reason:
        console.print(f"{info.status.value}: {info.reason}", style="red", highlight=False, markup=False)
    for line in failures(history):
        console.print(line, style="red", highlight=False, markup=False)


def progress_table(api: CloudAPI, info: RunInfo, started: float, names: dict[int, str] | None = None) -> Table:
    return history_table(api.history(info.run_id), f"run {info.run_id} · {info.config.algorithm} · "
                         f"{info.status.value}{f' ({info.reason})' if info.status == RunStatus.waiting else ''} · "
                         f"version {info.version}/{info.rounds} · buffered {info.buffered} · "
                         f"{time.monotonic() - started:.1f}s", last=15, names=names)


def watch_run(api: CloudAPI, run_id: str, timeout_s: float = 3600) -> RunInfo:
    started = time.monotonic()
    names: dict[int, str] = {}

    def poll(info: RunInfo) -> None:
        # Read again until every site of the run is named: one that never registered is asked for each poll.
        if info.config.selection is not None and len(names) < len(info.config.edge_ids()):
            names.update(site_names(api, info))
        live.update(progress_table(api, info, started, names))

    with Live(console=console, refresh_per_second=4) as live:
        return api.wait(run_id, timeout_s=timeout_s, poll_s=0.5, on_poll=poll)


def finish(api: CloudAPI, info: RunInfo, out: Path) -> None:
    console.print()
    history = api.history(info.run_id)
    paths = save_results(out, info, history, api.model(info.run_id))
    if history:
        console.print(f"[bold]final test accuracy: {_figure(100 * history[-1].test_accuracy, '.2f')}%[/] after "
                      f"{len(history)} rounds ({history[-1].elapsed_s:.1f}s)")
        if history[-1].federated:  # the devices' figures on their held-out splits (RunConfig.evaluation)
            newest = history[-1].federated[-1]
            console.print(f"[bold]federated accuracy: {100 * newest.accuracy:.2f}%[/] of version {newest.version} on "
                          f"{newest.num_samples} held-out samples at {len(newest.sites)} sites")
    else:
        console.print("no rounds completed")
    show_why(info, history)
    summary = group_summary(info.config, client_reports(history))
    if any(summary.values()):
        table = Table(title="clients' latest reports: mean ± spread over clients")
        names = sorted({n for metrics in summary.values() for n in metrics})
        for col in ("group", *names):
            table.add_column(col, justify="right")
        for group, metrics in summary.items():
            table.add_row(group, *(f"{metrics[n][0]:.4f} ± {metrics[n][1]:.4f}" if n in metrics else "–"
                                   for n in names))
        console.print(table)
    for name, path in paths.items():
        console.print(f"  {name:13s} {path}")
