"""What the cloud answers its edges' long-polls: the next global state an edge should train on, and the end of a
run it trains for."""
from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from fl_services.cloud.orchestrator import Orchestrator
from fl_services.cloud.storage import NotFound, Store
from fl_services.shared.core.reports import RunStatus
from fl_services.shared.server.app import Stopping
from fl_services.shared.wire.edge_cloud import EdgeRegistration, RunEnd


async def register(*, store: Store, registration: EdgeRegistration) -> None:
    """The edge and its site: the site first, so that a name another edge holds (409) registers nothing."""
    await store.report_site(registration)
    await store.register_edge(registration)


@dataclass(frozen=True)
class StatePoll:
    """What an edge's state long-poll says it holds: per run the version it has (`seen`), the runs it is
    working on (`busy`: never offered), and whether runs it has not seen may be offered (`others`)."""

    seen: dict[str, int]
    busy: frozenset[str]
    others: bool


@dataclass
class Offer:
    """What a long-poll answers: a global state (None: nothing newer), and the runs this edge takes part in
    that are running or paused, so the edge forgets (and stops working on) the others."""

    blob: bytes | None
    live: list[str]
    ended: bool  # a run the edge has or works on is no longer live: answer at once


async def global_state(*, store: Store, orchestrator: Orchestrator, stopping: Stopping, edge_id: int,
                       poll: StatePoll, timeout: float, gone: Callable[[], Awaitable[bool]]) -> Offer:
    """Waits up to `timeout` for a live run this edge takes part in with a version it has not seen, or a run
    it knows (seen or busy) that has ended; the offer then (no blob: nothing newer, the cloud stops, or the
    edge is `gone`), with the live runs as they are when it answers."""
    async def offer() -> Offer | None:
        # An edge that gave up on this poll (it asks again whenever one of its rounds ends) is not looked
        # for again: its wait ends at the next announce instead of reading Redis until the timeout.
        if await gone():
            return Offer(None, [], ended=True)
        found = await _offer(store, orchestrator, edge_id, poll)
        # A stopping cloud ends the poll at once too, with nothing.
        return found if found.blob is not None or found.ended or stopping.is_set() else None

    # Woken by every announce, this replica's or (through the event channel) another's: no re-checks.
    found = await orchestrator.wait_until(offer, timeout)
    if found is None:  # the deadline: the live runs as they are now
        found = await _offer(store, orchestrator, edge_id, poll)
    if stopping.is_set():
        found.blob = None
    return found


async def _offer(store: Store, orchestrator: Orchestrator, edge_id: int, poll: StatePoll) -> Offer:
    """The first live run with a state for this edge: one it has not seen (unless `others` is false) or
    newer than the version it has, never one it is `busy` with nor one whose last contribution from this
    edge still waits in the buffer (it re-executes once that one is consumed, on the newest version)."""
    live: list[str] = []
    offer: bytes | None = None
    for run_id in await store.active_runs():
        try:
            config = await store.config(run_id)
            run_status, version = await store.status(run_id)
        except NotFound:  # deleted meanwhile
            continue
        if edge_id not in config.edge_ids():
            continue
        live.append(run_id)
        if offer is not None or run_status != RunStatus.running or run_id in poll.busy:
            continue
        if run_id not in poll.seen and not poll.others or version <= poll.seen.get(run_id, -1):
            continue
        if await store.has_pending(run_id, edge_id):
            continue
        offer = await orchestrator.globals.blob(run_id, version)
    return Offer(offer, live, ended=bool((set(poll.seen) | poll.busy) - set(live)))


async def run_end(*, store: Store, orchestrator: Orchestrator, stopping: Stopping, run_id: str,
                  timeout: float) -> RunEnd | None:
    """How `run_id` ended, as soon as it no longer trains (stopped, finished or deleted); None if it still
    trains at the timeout, or the cloud stops."""
    async def ended() -> RunEnd | bool:
        return await _ended(store, run_id) or stopping.is_set()

    # A stop through any replica announces itself at once (through the event channel for the others).
    end = await orchestrator.wait_until(ended, timeout)
    return end if isinstance(end, RunEnd) else None


async def _ended(store: Store, run_id: str) -> RunEnd | None:
    """How the run ended, if it no longer trains: stopped, finished, or deleted (unknown)."""
    try:
        run_status, _ = await store.status(run_id)
    except NotFound:
        return RunEnd(run_id=run_id, status="deleted")
    if run_status in (RunStatus.stopped, RunStatus.finished):
        return RunEnd(run_id=run_id, status=run_status.value)
    return None
