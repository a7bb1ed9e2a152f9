"""Runs over the federation that exists: a run's selection resolved against the site registry when it is created,
a started run's wait for the devices it needs, and the registry as an operator reads it (each site online or
not, a run's sites and devices)."""
from __future__ import annotations

import asyncio
import contextlib
import logging
import statistics
from datetime import datetime, timedelta

from pydantic import ValidationError

from fl_services.cloud.audit import Auditor
from fl_services.cloud.initial_state import InvalidRun
from fl_services.cloud.metrics import connected
from fl_services.cloud.orchestrator import Orchestrator
from fl_services.cloud.storage import Conflict, NotFound, Store, now
from fl_services.shared.core.algorithms import registry
from fl_services.shared.core.config import RunConfig, matches
from fl_services.shared.core.data.summary import RunTask, check_fits
from fl_services.shared.core.federation import run_task
from fl_services.shared.core.reports import RoundRecord, RunStatus
from fl_services.shared.wire.admin import RunInfo, RunSite, RunSites, SampleOutlier, SiteInfo
from fl_services.shared.wire.edge_cloud import LabelSetCount, SiteRun

log = logging.getLogger(__name__)

# A site is offline once this many of its report intervals passed without a report (one lost report, or a
# slow one, is not an outage); an edge that does not say its interval is taken to report every 10 s.
MISSED_REPORTS = 3
DEFAULT_REPORT_S = 10.0
# A claimed sample count above this many times the round's median is shown as an outlier; the median needs a few
# counts to stand for the round (docs/explanation-algorithms-robust.md, "Sample counts").
OUTLIER_RATIO = 5.0
OUTLIER_MIN_CLIENTS = 3
# What a site's tally of a run tells of it (SiteRun's fields a RunSite shows).
_TALLIED = {"version", "tasks", "answered", "failed", "members", "refused"}
# A run stopped for want of members quotes this many of its refused devices' reasons.
_REFUSALS_QUOTED = 5


def with_status(site: SiteInfo, at: datetime) -> SiteInfo:
    late = at - site.last_seen > timedelta(seconds=MISSED_REPORTS * (site.report_s or DEFAULT_REPORT_S))
    return site.model_copy(update={"status": "offline" if late else "online"})


async def site_registry(*, store: Store) -> list[SiteInfo]:
    """Every site, by name, online or offline as its reports arrive."""
    at = now()
    return [with_status(site, at) for site in await store.sites()]


async def run_sites(*, store: Store, run_id: str) -> RunSites:
    """The sites a run uses (its edges), each with the run's current round there and the listed devices taking
    part in it or failing it, as their last reports say; NotFound for an unknown run."""
    return sites_of_run(await store.info(run_id), await site_registry(store=store))


def sites_of_run(info: RunInfo, known: list[SiteInfo]) -> RunSites:
    """The run's sites as the registry's `known` sites say; all_failed where every one of them tallies the run's
    current version with each of its tasks failed (an edge that never reported, or reports no task of that
    version, says nothing)."""
    run_id = info.run_id
    by_edge = {site.edge_id: site for site in known}
    sites = []
    for edge_id in info.config.edge_ids():
        site = by_edge.get(edge_id)
        if site is None:
            sites.append(RunSite(edge_id=edge_id))
            continue
        tally = next((r for r in site.runs if r.run_id == run_id), None)
        devices = [d for d in site.device_page if run_id in d.runs or d.failed_run == run_id]
        sites.append(RunSite(name=site.name, edge_id=edge_id, status=site.status, devices=devices,
                             **(tally.model_dump(include=_TALLIED) if tally else {})))
    all_failed = all(s.version == info.version and 0 < s.tasks == s.failed for s in sites)
    reasons = sorted({d.failure for s in sites for d in s.devices if d.failed_run == run_id and d.failure}
                     | {f.error for s in sites for f in s.refused})
    last = info.last_round
    return RunSites(run_id=run_id, sites=sites, all_failed=all_failed,
                    reasons=reasons, sample_outliers=sample_outliers(last) if last else [],
                    outliers_round=last.round if last else None)


def sample_outliers(record: RoundRecord) -> list[SampleOutlier]:
    """The round's devices whose claimed training sample count exceeds OUTLIER_RATIO × the median of the round's
    claims (none with fewer than OUTLIER_MIN_CLIENTS claims). Only the high side: a small claim gains no weight."""
    if len(record.clients) < OUTLIER_MIN_CLIENTS:
        return []
    median = statistics.median(c.num_samples for c in record.clients)
    return [SampleOutlier(client_id=c.client_id, edge_id=c.edge_id, num_samples=c.num_samples, median=median)
            for c in record.clients if c.num_samples > OUTLIER_RATIO * median]


async def resolve(*, store: Store, config: RunConfig) -> RunConfig:
    """The config with its selection's sites resolved to their edge ids (InvalidRun if none or an unknown one is
    named) and its topology sized to them: num_edges the sites, a synchronous run's buffer all of them. The sites
    are those registered now; devices may register at them until the run ends."""
    selection = config.selection
    if selection is None:
        return _with_site_keys(config, await store.sites()) if config.secure_aggregation.cloud else config
    registered = sites = await site_registry(store=store)
    if isinstance(selection.sites, list):
        unknown = sorted(set(selection.sites) - {s.name for s in sites})
        if unknown:
            raise InvalidRun(f"selection.sites names sites that are not registered: {unknown} (registered: "
                             f"{[s.name for s in sites]})")
    else:
        # "all" or labels: the sites that can take part now. An offline one would never contribute, and a
        # synchronous run waits for every site it has. Sites named one by one are taken as named.
        sites = [s for s in sites if s.status == "online"]
    chosen = sorted({s.edge_id for s in sites if selection.takes_site(s.name, s.labels)})
    if not chosen:
        offline = [s.name for s in registered if s.status == "offline"]
        raise InvalidRun(f"no online site matches selection.sites {selection.sites!r} "
                         f"(online: {[f'{s.name} {s.labels}' for s in sites]}; offline: {offline})")
    synchronous = registry.get_algorithm_class(config.algorithm).synchronous
    if synchronous and config.topology.buffer_size < config.topology.num_edges:
        # Buffered averaging is proven equal to the reference only over the simulated federation's fixed edges;
        # here B is sized to the sites found, so a smaller buffer asked for would be silently overridden.
        raise InvalidRun(f"topology.buffer_size {config.topology.buffer_size} < num_edges "
                         f"{config.topology.num_edges} (buffered averaging) takes a simulated federation: a run over "
                         "registered devices (selection) updates once each of its sites has contributed; leave "
                         "topology out")
    buffer_size = len(chosen) if synchronous else min(config.topology.buffer_size, len(chosen))
    data = config.model_dump()
    data["selection"]["edge_ids"] = chosen
    data["topology"].update(num_edges=len(chosen), buffer_size=buffer_size)
    try:
        return _with_site_keys(registry.parse_config(data), registered)
    except ValidationError as exc:
        raise InvalidRun(f"the run over sites {chosen}: {exc}") from exc


def _with_site_keys(config: RunConfig, sites: list[SiteInfo]) -> RunConfig:
    """With secure_aggregation.cloud: the config holding its sites' public keys as they registered them (InvalidRun
    naming the sites that registered none); the cloud relays them and holds no private key."""
    if not config.secure_aggregation.cloud:
        return config
    keys = {s.edge_id: s.mask_key for s in sites if s.mask_key is not None}
    missing = sorted(set(config.edge_ids()) - set(keys))
    if missing:
        raise InvalidRun(f"secure_aggregation.cloud needs every site's public key; edges {missing} have not "
                         "registered one (they register it when they start)")
    data = config.model_dump()
    data["secure_aggregation"]["site_keys"] = {e: keys[e] for e in config.edge_ids()}
    return registry.parse_config(data)


async def remove_site(*, store: Store, audit: Auditor, name: str) -> None:
    """Takes the site `name` out of the registry (NotFound if none); Conflict while a run that has not ended uses
    it (stop or delete that run first)."""
    site = next((s for s in await store.sites() if s.name == name), None)
    if site is None:
        raise NotFound(f"no site named {name!r}")
    live = await _runs_in(store, await store.run_ids(), (RunStatus.waiting, RunStatus.running, RunStatus.paused))
    using = [info.run_id for info in live if site.edge_id in info.config.edge_ids()]
    if using:
        raise Conflict(f"site {name!r} (edge {site.edge_id}) is used by runs that have not ended: {sorted(using)}; "
                       "stop them first", "site_in_use")
    await store.remove_site(name)
    await audit("remove_site", name, f"edge {site.edge_id}")


def devices_at(config: RunConfig, sites: list[SiteInfo], task: RunTask | None = None) -> int:
    """The devices connected (not offline) at the run's sites that its device selector takes and whose data can
    train `task` (None: any data), as the sites last reported them (counted per label set and data fit; a set
    without a fit, of devices that train the partition their id names, by those ids below the run's
    data.num_clients, as an edge takes such a device as a member; a site that reports no label sets, by its
    connected devices)."""
    edges = set(config.edge_ids())
    selector = config.selection.device_selector if config.selection is not None else None

    def able(s: LabelSetCount) -> int:
        if task is None:
            return s.devices
        if s.fit is not None:
            return 0 if check_fits(s.fit, task) else s.devices
        if s.ids is None:
            return s.devices
        partitions = config.data.num_clients  # a device without a summary trains the partition its id names
        return sum(max(0, min(high, partitions - 1) - low + 1) for low, high in s.ids)

    def taken(site: SiteInfo) -> int:
        if site.label_sets is not None:
            return sum(able(s) for s in site.label_sets if matches(s.labels, selector))
        return connected(site) if site.states else site.devices or 0

    return sum(taken(s) for s in sites if s.edge_id in edges)


def _has_members(site: SiteInfo, tally: SiteRun | None) -> bool:
    return site.status == "online" and tally is not None and bool(tally.members)


def untrainable(run_id: str, config: RunConfig, sites: list[SiteInfo]) -> str | None:
    """Why the run cannot make a version, as its sites last reported it: fewer of them online with a member than
    a cloud update needs (its buffer), each refused device's reason given; None if enough have one."""
    edges = set(config.edge_ids())
    reported = {s.edge_id: (s, next((r for r in s.runs if r.run_id == run_id), None)) for s in sites}
    able = [e for e in edges if e in reported and _has_members(*reported[e])]
    if len(able) >= config.topology.buffer_size:
        return None
    refused = [f"device {f.client_id} at {site.name}: {f.error}" for site, tally in reported.values()
               if site.edge_id in edges and tally is not None for f in tally.refused]
    return (f"{len(able)} of its sites {sorted(edges)} have a member able to train it, and a version needs "
            f"{config.topology.buffer_size}" + (f"; refused: {'; '.join(refused[:_REFUSALS_QUOTED])}" if refused
                                                 else ""))


async def _runs_in(store: Store, run_ids: list[str], statuses: tuple[RunStatus, ...]) -> list[RunInfo]:
    """The runs of `run_ids` in one of `statuses`, those deleted meanwhile left out."""
    infos = []
    for run_id in run_ids:
        with contextlib.suppress(NotFound):
            infos.append(await store.info(run_id))
    return [info for info in infos if info.status in statuses]


async def _runs_with_sites(store: Store, run_ids: list[str],
                           statuses: tuple[RunStatus, ...]) -> list[tuple[RunInfo, list[SiteInfo]]]:
    """The runs of `run_ids` in one of `statuses` (those deleted meanwhile left out), each with the site registry
    as it is now, online or offline (read once, if any run is)."""
    infos = await _runs_in(store, run_ids, statuses)
    sites = await site_registry(store=store) if infos else []
    return [(info, sites) for info in infos]


# What each waiting run trains, which its devices' data must fit (its data set loaded once per run and process).
_TASKS: dict[str, RunTask | None] = {}
# Its data set loaded at creation already; a loader that hangs now must not hold the admission of the others.
TASK_TIMEOUT_S = 120.0


async def _task_of(info: RunInfo) -> RunTask | None:
    """The run's task as its edges derive it (None where it cannot be derived: any data is then counted)."""
    if info.run_id not in _TASKS:
        try:
            _TASKS[info.run_id] = await asyncio.wait_for(asyncio.to_thread(run_task, info.config), TASK_TIMEOUT_S)
        except Exception:  # e.g. a data file this cloud does not hold: the edges check each device then
            log.warning("run %s: cannot derive what it trains; its waiting counts every device", info.run_id,
                        exc_info=True)
            _TASKS[info.run_id] = None
    return _TASKS[info.run_id]


async def admit_waiting(*, store: Store, orchestrator: Orchestrator, audit: Auditor) -> None:
    """Admits each waiting run whose sites have min_devices connected that can train it; stops, saying why, one
    that waited past its start_timeout_s, and an admitted one still at version 0 past it whose sites have no member
    able to train."""
    runs = await _runs_with_sites(store, await store.run_ids(), (RunStatus.waiting, RunStatus.running))
    for run_id in set(_TASKS) - {info.run_id for info, _ in runs if info.status == RunStatus.waiting}:
        del _TASKS[run_id]  # admitted, stopped or deleted: its task is not asked again
    for info, sites in runs:
        run_id, selection = info.run_id, info.config.selection
        if selection is None:
            continue
        timed_out = info.started_at is not None and \
            now() - info.started_at > timedelta(seconds=selection.start_timeout_s)
        if info.status == RunStatus.running:
            why = untrainable(run_id, info.config, sites) if timed_out and info.version == 0 else None
            if why is not None:
                reason = f"no version after {selection.start_timeout_s:g} s: {why}"
                with contextlib.suppress(Conflict):  # another replica (or an operator) moved it meanwhile
                    await store.transition(run_id, "stop", reason)
                    await audit("stop", run_id, reason)
                    orchestrator.notify()
                    await orchestrator.announce()
            continue
        task = await _task_of(info)
        found = devices_at(info.config, sites, task)
        misfits = devices_at(info.config, sites) - found
        present = f"{found} able to train it connected" + \
            (f" ({misfits} more whose data does not fit it)" if misfits else "")
        try:
            if found >= selection.min_devices:
                await store.transition(run_id, "admit")
                await audit("admit", run_id, f"{found} devices able to train it connected at its sites")
            elif timed_out:
                reason = (f"waited {selection.start_timeout_s:g} s for {selection.min_devices} devices at its sites "
                          f"{info.config.edge_ids()}; {present}")
                await store.transition(run_id, "stop", reason)
                await audit("stop", run_id, reason)
            else:
                # Said while it waits (fedctl, the dashboard), not only once it stops at its timeout.
                waiting_for = (f"waiting up to {selection.start_timeout_s:g} s for {selection.min_devices} devices "
                               f"at its sites {info.config.edge_ids()}; {present}")
                if waiting_for != info.reason:
                    await store.note_waiting(run_id, waiting_for)
                continue
        except Conflict:  # another replica (or an operator) moved it meanwhile
            continue
        orchestrator.notify()
        await orchestrator.announce()


# How a run stopped because every device failed says so in RunInfo.reason (the status line of fedctl and the
# dashboard), followed by what the devices reported.
EVERY_DEVICE_FAILED = "every device failed"


async def stop_failed(*, store: Store, orchestrator: Orchestrator, audit: Auditor) -> None:
    """Stops each running run whose every edge reports that every device failed the run's current round (its
    sites' all_failed): its failed tasks are not handed out again, so it would otherwise stay `running` for good,
    training nothing."""
    for info, sites in await _runs_with_sites(store, await store.active_runs(), (RunStatus.running,)):
        run_id = info.run_id
        seen = sites_of_run(info, sites)
        if not seen.all_failed:
            continue
        devices = sum(s.failed for s in seen.sites)
        said = [d for s in seen.sites for d in s.devices if d.failed_run == run_id and d.failure][:3]
        reason = (f"{EVERY_DEVICE_FAILED} in round {info.version} ({devices} device(s)): " + "; ".join(
            f"client {d.client_id} ({d.failure_kind or 'training'}): {' '.join((d.failure or '').split())}"
            for d in said))
        try:
            await store.transition(run_id, "stop", reason)
        except Conflict:  # another replica (or an operator) moved it meanwhile
            continue
        log.error("run %s stopped: %s", run_id, reason)
        await audit("stop", run_id, reason)
        orchestrator.notify()
        await orchestrator.announce()


async def admit_forever(*, store: Store, orchestrator: Orchestrator, audit: Auditor, interval_s: float) -> None:
    """Admits the waiting runs whose devices came, and stops the running ones whose every device failed."""
    while True:
        try:
            await admit_waiting(store=store, orchestrator=orchestrator, audit=audit)
            await stop_failed(store=store, orchestrator=orchestrator, audit=audit)
        except Exception:  # the storage away for a while: the next pass tries again
            log.exception("admitting waiting runs (or stopping failed ones) failed")
        await asyncio.sleep(interval_s)
