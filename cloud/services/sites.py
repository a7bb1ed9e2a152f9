"""Runs over the federation that exists: a run's selection resolved against the site registry when it is created,
a started run's wait for the devices it needs, and the registry as an operator reads it (each site online or
not, a run's sites and devices)."""
from __future__ import annotations

import asyncio
import logging
from datetime import datetime, timedelta

from pydantic import ValidationError

from fl_services.cloud.audit import Auditor
from fl_services.cloud.initial_state import InvalidRun
from fl_services.cloud.orchestrator import Orchestrator
from fl_services.cloud.storage import Conflict, NotFound, Store, now
from fl_services.shared.core.algorithms import registry
from fl_services.shared.core.config import RunConfig
from fl_services.shared.core.reports import RunStatus
from fl_services.shared.wire.admin import RunSite, RunSites, SiteInfo

log = logging.getLogger(__name__)

# A site is offline once this many of its report intervals passed without a report (one lost report, or a
# slow one, is not an outage); an edge that does not say its interval is taken to report every 10 s.
MISSED_REPORTS = 3
DEFAULT_REPORT_S = 10.0


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
    config = await store.config(run_id)
    by_edge = {site.edge_id: site for site in await site_registry(store=store)}
    sites = []
    for edge_id in config.edge_ids():
        site = by_edge.get(edge_id)
        if site is None:
            sites.append(RunSite(edge_id=edge_id))
            continue
        tally = next((r for r in site.runs if r.run_id == run_id), None)
        devices = [d for d in site.device_page if run_id in d.runs or d.failed_run == run_id]
        sites.append(RunSite(name=site.name, edge_id=edge_id, status=site.status, devices=devices,
                             **(tally.model_dump(include={"tasks", "answered", "failed"}) if tally else {})))
    tasks = sum(s.tasks for s in sites)
    reasons = sorted({d.failure for s in sites for d in s.devices if d.failed_run == run_id and d.failure})
    return RunSites(run_id=run_id, sites=sites, all_failed=tasks > 0 and sum(s.failed for s in sites) == tasks,
                    reasons=reasons)


async def resolve(*, store: Store, config: RunConfig) -> RunConfig:
    """The config with its selection's sites resolved to their edge ids (InvalidRun if none or an unknown one is
    named) and its topology sized to them: num_edges the sites, a synchronous run's buffer all of them. The sites
    are those registered now; devices may register at them until the run ends."""
    selection = config.selection
    if selection is None:
        return await _with_site_keys(store, config)
    sites = await store.sites()
    if isinstance(selection.sites, list):
        unknown = sorted(set(selection.sites) - {s.name for s in sites})
        if unknown:
            raise InvalidRun(f"selection.sites names sites that are not registered: {unknown} (registered: "
                             f"{[s.name for s in sites]})")
    chosen = sorted({s.edge_id for s in sites if selection.takes_site(s.name, s.labels)})
    if not chosen:
        raise InvalidRun(f"no registered site matches selection.sites {selection.sites!r} "
                         f"(registered: {[f'{s.name} {s.labels}' for s in sites]})")
    buffer_size = len(chosen) if registry.get_algorithm_class(config.algorithm).synchronous else \
        min(config.topology.buffer_size, len(chosen))
    data = config.model_dump()
    data["selection"]["edge_ids"] = chosen
    data["topology"].update(num_edges=len(chosen), buffer_size=buffer_size)
    try:
        return await _with_site_keys(store, registry.parse_config(data))
    except ValidationError as exc:
        raise InvalidRun(f"the run over sites {chosen}: {exc}") from exc


async def _with_site_keys(store: Store, config: RunConfig) -> RunConfig:
    """With secure_aggregation.cloud: the config holding its sites' public keys as they registered them (InvalidRun
    naming the sites that registered none); the cloud relays them and holds no private key."""
    if not config.secure_aggregation.cloud:
        return config
    keys = {s.edge_id: s.mask_key for s in await store.sites() if s.mask_key is not None}
    missing = sorted(set(config.edge_ids()) - set(keys))
    if missing:
        raise InvalidRun(f"secure_aggregation.cloud needs every site's public key; edges {missing} have not "
                         "registered one (they register it when they start)")
    data = config.model_dump()
    data["secure_aggregation"]["site_keys"] = {e: keys[e] for e in config.edge_ids()}
    return registry.parse_config(data)


def devices_at(config: RunConfig, sites: list[SiteInfo]) -> int:
    """The devices registered at the run's sites, as they last reported them."""
    edges = set(config.edge_ids())
    return sum(s.devices or 0 for s in sites if s.edge_id in edges)


async def admit_waiting(*, store: Store, orchestrator: Orchestrator, audit: Auditor) -> None:
    """Admits each waiting run whose sites have min_devices registered; stops, saying why, one that waited past its
    start_timeout_s."""
    sites: list[SiteInfo] | None = None
    for run_id in await store.run_ids():
        try:
            info = await store.info(run_id)
        except NotFound:
            continue
        selection = info.config.selection
        if info.status != RunStatus.waiting or selection is None:
            continue
        sites = sites if sites is not None else await store.sites()
        found = devices_at(info.config, sites)
        try:
            if found >= selection.min_devices:
                await store.transition(run_id, "admit")
                await audit("admit", run_id, f"{found} devices registered at its sites")
            elif info.started_at is not None and now() - info.started_at > timedelta(seconds=selection.start_timeout_s):
                reason = (f"waited {selection.start_timeout_s:g} s for {selection.min_devices} devices at its sites "
                          f"{info.config.edge_ids()}; {found} registered")
                await store.transition(run_id, "stop", reason)
                await audit("stop", run_id, reason)
            else:
                continue
        except Conflict:  # another replica (or an operator) moved it meanwhile
            continue
        orchestrator.notify()
        await orchestrator.announce()


async def admit_forever(*, store: Store, orchestrator: Orchestrator, audit: Auditor, interval_s: float) -> None:
    while True:
        try:
            await admit_waiting(store=store, orchestrator=orchestrator, audit=audit)
        except Exception:  # the storage away for a while: the next pass tries again
            log.exception("admitting waiting runs failed")
        await asyncio.sleep(interval_s)
