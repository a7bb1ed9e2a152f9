"""Edge-facing API: register, long-poll the global state, submit a contribution to the buffer."""
from __future__ import annotations

import asyncio
from dataclasses import dataclass

from fastapi import HTTPException, Path, Query, Request, Response, status

from fl_services.cloud.contributions import check_contribution
from fl_services.cloud.deps import OrchestratorDep, SettingsDep, StoppingDep, StoreDep, require_edge
from fl_services.cloud.global_states import GlobalStates
from fl_services.cloud.storage import NotFound, Store
from fl_services.shared.core.reports import EdgeContributionHeader, RunStatus
from fl_services.shared.core.tensors import InvalidContent
from fl_services.shared.server.auth import guarded_router
from fl_services.shared.server.bodies import binary, read_json, read_message, reject
from fl_services.shared.server.docs import binary_body_doc, json_body_doc
from fl_services.shared.server.errors import error_responses
from fl_services.shared.server.metrics import note_outcome
from fl_services.shared.server.quotas import rate_limited
from fl_services.shared.wire.edge_cloud import EdgeRegistration, RunEnd, SubmitReceipt
from fl_services.shared.wire.protocol import LIVE_RUNS

router = guarded_router(require_edge, prefix="/api/v1", tags=["edges"])


@router.post("/edges", responses=error_responses(400, 408, 413, 422, 429),
             openapi_extra=json_body_doc(EdgeRegistration))
async def register(request: Request, store: StoreDep) -> EdgeRegistration:
    reg = await read_json(request, EdgeRegistration)  # after the token check
    await rate_limited(request, "registration", reg.edge_id)
    await store.register_edge(reg)
    return reg


@router.get("/edges/revoked-tokens")
async def revoked_token_ids(store: StoreDep) -> list[str]:
    """The ids of the revoked device tokens, which each edge refreshes and refuses."""
    return [r.token_id for r in await store.revoked_tokens()]


@dataclass
class Offer:
    """What a long-poll answers: a global state (None: nothing newer), and the runs this edge takes part in
    that are running or paused, so the edge forgets (and stops working on) the others."""

    blob: bytes | None
    live: list[str]
    ended: bool  # a run the edge has or works on is no longer live: answer at once


def _seen(entries: list[str], run_id: str | None, after: int) -> dict[str, int]:
    """`seen` entries "run_id:version"; the older `run_id` and `after` are one more."""
    seen: dict[str, int] = {}
    for entry in entries:
        run, _, version = entry.rpartition(":")
        if not run or not version.lstrip("-").isdigit() or int(version) < -1:
            raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT,
                                f"seen entry {entry[:100]!r} is not 'run_id:version' with a version ≥ -1")
        seen[run] = int(version)
    if run_id is not None:
        seen[run_id] = after
    return seen


async def _offer(store: Store, globals_: GlobalStates, edge_id: int, seen: dict[str, int], busy: set[str],
                 others: bool) -> Offer:
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
        if edge_id >= config.topology.num_edges:
            continue
        live.append(run_id)
        if offer is not None or run_status != RunStatus.running or run_id in busy:
            continue
        if run_id not in seen and not others or version <= seen.get(run_id, -1):
            continue
        if await store.has_pending(run_id, edge_id):
            continue
        offer = await globals_.blob(run_id, version)
    return Offer(offer, live, ended=bool((set(seen) | busy) - set(live)))


@router.get("/edges/{edge_id}/global", responses={
    200: {"description": "the global state of a run (its header says which run and version)",
          "headers": {LIVE_RUNS: {"description": "the live runs this edge takes part in, comma-separated",
                                  "schema": {"type": "string"}}}},
    204: {"description": "nothing newer before the timeout, or a run the edge knows has ended"},
    **error_responses(404, 422)})
async def global_state(
    edge_id: int,
    request: Request,
    store: StoreDep,
    settings: SettingsDep,
    orchestrator: OrchestratorDep,
    stopping: StoppingDep,
    seen: list[str] = Query([], max_length=1000, description="'run_id:version' of every run the edge has a state of"),
    busy: list[str] = Query([], max_length=1000, description="runs the edge is working on: never offered"),
    others: bool = Query(True, description="false: offer only the runs in `seen`"),
    run_id: str | None = Query(None, description="with `after`: one more `seen` entry"),
    after: int = Query(-1, ge=-1),
    timeout: float = Query(20.0, ge=0),
):
    """Long-poll: answers as soon as a live run this edge takes part in has a version it has not seen, or at
    once if a run it knows (seen or busy) has ended (stopped, finished): the edge then drops that run."""
    if not await store.edge_known(edge_id):
        raise NotFound(f"unknown edge {edge_id}; register first")
    known = _seen(seen, run_id, after)
    working = set(busy)

    async def offer() -> Offer | None:
        # An edge that gave up on this poll (it asks again whenever one of its rounds ends) is not looked
        # for again: its wait ends at the next announce instead of reading Redis until the timeout.
        if await request.is_disconnected():
            return Offer(None, [], ended=True)
        found = await _offer(store, orchestrator.globals, edge_id, known, working, others)
        # A stopping cloud ends the poll at once too, with nothing.
        return found if found.blob is not None or found.ended or stopping.is_set() else None

    # Woken by every announce, this replica's or (through the event channel) another's: no re-checks.
    found = await orchestrator.wait_until(offer, min(timeout, settings.long_poll_max_s))
    if found is None:  # the deadline: the live runs as they are now
        found = await _offer(store, orchestrator.globals, edge_id, known, working, others)
    headers = {LIVE_RUNS: ",".join(found.live)}
    if found.blob is not None and not stopping.is_set():
        return binary(found.blob, headers=headers)
    return Response(status_code=status.HTTP_204_NO_CONTENT, headers=headers)


async def _ended(store, run_id: str) -> RunEnd | None:
    """How the run ended, if it no longer trains: stopped, finished, or deleted (unknown)."""
    try:
        run_status, _ = await store.status(run_id)
    except NotFound:
        return RunEnd(run_id=run_id, status="deleted")
    if run_status in (RunStatus.stopped, RunStatus.finished):
        return RunEnd(run_id=run_id, status=run_status.value)
    return None


@router.get("/edges/{edge_id}/runs/{run_id}/end", response_model=RunEnd, responses={
    204: {"description": "the run still trains at the timeout"}, **error_responses(404, 422)})
async def run_end(
    edge_id: int,
    store: StoreDep,
    settings: SettingsDep,
    orchestrator: OrchestratorDep,
    stopping: StoppingDep,
    run_id: str = Path(min_length=1, max_length=64),
    timeout: float = Query(20.0, ge=0),
) -> RunEnd | Response:
    """Long-poll an edge keeps open while it runs a round of `run_id`: answers as soon as that run no longer
    trains (stopped, finished or deleted), so that the edge drops the round at once; before, it learnt of
    a stop only at the round's deadline (up to a day), while its clients trained for nothing and the next
    run waited."""
    if not await store.edge_known(edge_id):
        raise NotFound(f"unknown edge {edge_id}; register first")

    async def ended() -> RunEnd | bool:
        return await _ended(store, run_id) or stopping.is_set()

    # A stop through any replica announces itself at once (through the event channel for the others).
    end = await orchestrator.wait_until(ended, min(timeout, settings.long_poll_max_s))
    return end if isinstance(end, RunEnd) else Response(status_code=status.HTTP_204_NO_CONTENT)


@router.post("/edges/{edge_id}/contributions", status_code=status.HTTP_202_ACCEPTED,
             responses=error_responses(400, 404, 408, 409, 413, 422, 429), openapi_extra=binary_body_doc())
async def submit(
    edge_id: int, request: Request, store: StoreDep, settings: SettingsDep, orchestrator: OrchestratorDep
) -> SubmitReceipt:
    """Accepts an edge's contribution into the run's buffer (idempotent per idempotency key)."""
    await rate_limited(request, "contribution", edge_id)  # before its body is read
    tensors, header, blob = await read_message(request, EdgeContributionHeader)
    if header.edge_id != edge_id:
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT,
                            f"header edge_id {header.edge_id} does not match the URL's {edge_id}")
    if not await store.edge_known(edge_id):
        raise NotFound(f"unknown edge {edge_id}; register first")
    run_id = header.run_id
    algorithm = orchestrator.algorithm(run_id, await store.config(run_id))
    # The global state's shapes alone (its header), not a copy of it. The check reads every value: on a
    # worker thread, so long-polls are answered meanwhile.
    global_ = await orchestrator.globals.layout(run_id)
    try:
        await asyncio.to_thread(check_contribution, algorithm, global_, header, tensors)
    except InvalidContent as exc:
        raise reject(exc) from exc
    outcome = await store.submit(header, blob, algorithm.synchronous)
    if outcome.duplicate:
        note_outcome(request, "duplicate")
    orchestrator.notify()
    return SubmitReceipt(accepted=outcome.accepted, duplicate=outcome.duplicate, buffered=outcome.buffered)
