"""Runs over the federation that exists: a run's selection resolved against the site registry when it is created,
and a started run's wait for the devices it needs."""
from __future__ import annotations

import asyncio
import contextlib
import logging
from datetime import timedelta

from pydantic import ValidationError

from fl_services.cloud.audit import Auditor
from fl_services.cloud.initial_state import InvalidRun
from fl_services.cloud.orchestrator import Orchestrator
from fl_services.cloud.storage import Conflict, NotFound, Store, now
from fl_services.shared.core.algorithms import registry
from fl_services.shared.core.config import RunConfig
from fl_services.shared.core.reports import RunStatus
from fl_services.shared.wire.admin import RunInfo, SiteInfo

log = logging.getLogger(__name__)


async def resolve(*, store: Store, config: RunConfig) -> RunConfig:
    """The config with its selection's sites resolved to their edge ids (InvalidRun if none or an unknown one is
    named) and its topology sized to them: num_edges the sites, a synchronous run's buffer all of them. The sites
    are those registered now; devices may register at them until the run ends."""
    selection = config.selection
    if selection is None:
        return config
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
        return registry.parse_config(data)
    except ValidationError as exc:
        raise InvalidRun(f"the run over sites {chosen}: {exc}") from exc


def devices_at(config: RunConfig, sites: list[SiteInfo]) -> int:
    """The devices registered at the run's sites, as they last reported them."""
    edges = set(config.edge_ids())
    return sum(s.devices or 0 for s in sites if s.edge_id in edges)


async def _runs_with_sites(store: Store, run_ids: list[str], status: RunStatus) -> list[tuple[RunInfo, list[SiteInfo]]]:
    """The runs of `run_ids` that are in `status` (those deleted meanwhile left out), each with the sites as they
    are now (read once, if any run is)."""
    infos = []
    for run_id in run_ids:
        with contextlib.suppress(NotFound):
            infos.append(await store.info(run_id))
    infos = [info for info in infos if info.status == status]
    sites = await store.sites() if infos else []
    return [(info, sites) for info in infos]


async def admit_waiting(*, store: Store, orchestrator: Orchestrator, audit: Auditor) -> None:
    """Admits each waiting run whose sites have min_devices registered; stops, saying why, one that waited past its
    start_timeout_s."""
    for info, sites in await _runs_with_sites(store, await store.run_ids(), RunStatus.waiting):
        run_id, selection = info.run_id, info.config.selection
        if selection is None:
            continue
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


# How a run stopped because every device failed says so in RunInfo.reason (the status line of fedctl and the
# dashboard), followed by what the devices reported.
EVERY_DEVICE_FAILED = "every device failed"


async def stop_failed(*, store: Store, orchestrator: Orchestrator, audit: Auditor) -> None:
    """Stops each running run whose every edge reports that every device failed the run's current round: its
    failed tasks are not handed out again, so it would otherwise stay `running` for good, training nothing."""
    for info, sites in await _runs_with_sites(store, await store.active_runs(), RunStatus.running):
        run_id = info.run_id
        edges = set(info.config.edge_ids())
        failed = {s.edge_id: s.failed_round for s in sites if s.edge_id in edges and s.failed_round is not None
                  and (s.failed_round.run_id, s.failed_round.version) == (run_id, info.version)}
        if set(failed) != edges:
            continue
        devices = sum(f.devices for f in failed.values())
        said = [f for edge_id in sorted(failed) for f in failed[edge_id].failures][:3]
        reason = (f"{EVERY_DEVICE_FAILED} in round {info.version} ({devices} device(s)): "
                  + "; ".join(f"client {f.client_id} ({f.kind}): {' '.join(f.error.split())}" for f in said))
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
