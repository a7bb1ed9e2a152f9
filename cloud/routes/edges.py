"""Edge-facing API: register, long-poll the global state, submit a contribution to the buffer."""
from __future__ import annotations

import asyncio

from fastapi import HTTPException, Path, Query, Request, Response, status

from cloud.contributions import check_contribution
from cloud.deps import OrchestratorDep, SettingsDep, StoppingDep, StoreDep, require_edge
from cloud.store import NotFound
from shared import web
from shared.metrics import note_outcome
from shared.schemas import EdgeContributionHeader, EdgeRegistration, GlobalStateHeader, RunEnd, RunStatus, SubmitReceipt
from shared.transport.records import decode
from shared.transport.tensors import InvalidContent
from shared.web import binary, rate_limited, read_json, read_message, reject

router = web.guarded_router(require_edge, prefix="/api/v1", tags=["edges"])


@router.post("/edges", responses=web.error_responses(400, 408, 413, 422, 429),
             openapi_extra=web.json_body_doc(EdgeRegistration))
async def register(request: Request, store: StoreDep) -> EdgeRegistration:
    reg = await read_json(request, EdgeRegistration)  # after the token check
    await rate_limited(request, "registration", reg.edge_id)
    await store.register_edge(reg)
    return reg


@router.get("/edges/revoked-tokens")
async def revoked_token_ids(store: StoreDep) -> list[str]:
    """The ids of the revoked device tokens, which each edge refreshes and refuses."""
    return [r.token_id for r in await store.revoked_tokens()]


@router.get("/edges/{edge_id}/global", responses={204: {"description": "nothing newer before the timeout"},
                                                  **web.error_responses(404, 422)})
async def global_state(
    edge_id: int,
    store: StoreDep,
    settings: SettingsDep,
    orchestrator: OrchestratorDep,
    stopping: StoppingDep,
    run_id: str | None = None,
    after: int = Query(-1, ge=-1),
    timeout: float = Query(20.0, ge=0),
):
    """Long-poll: answers as soon as there is a version newer than `after` of the active run."""
    if not await store.edge_known(edge_id):
        raise NotFound(f"unknown edge {edge_id}; register first")

    async def offer() -> bytes | bool:
        # True once the cloud is stopping: the poll ends at once, with nothing.
        return await orchestrator.offers.offer(edge_id, run_id, after) or stopping.is_set()

    # Short waits (recheck_s) also catch versions published by another cloud process sharing this Redis
    # (`offers` reads Redis at most every 0.5 s for all the polls together).
    blob = await orchestrator.wait_until(offer, min(timeout, settings.long_poll_max_s), recheck_s=0.5)
    return binary(blob) if isinstance(blob, bytes) else Response(status_code=status.HTTP_204_NO_CONTENT)


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
    204: {"description": "the run still trains at the timeout"}, **web.error_responses(404, 422)})
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

    # A stop through this process announces itself at once; the recheck catches one made through another
    # cloud process sharing the Redis, and is slower than the global long-poll's: every edge holds this
    # poll through every round.
    end = await orchestrator.wait_until(ended, min(timeout, settings.long_poll_max_s), recheck_s=2.0)
    return end if isinstance(end, RunEnd) else Response(status_code=status.HTTP_204_NO_CONTENT)


@router.post("/edges/{edge_id}/contributions", status_code=status.HTTP_202_ACCEPTED,
             responses=web.error_responses(400, 404, 408, 409, 413, 422, 429), openapi_extra=web.binary_body_doc())
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
    # Decoding copies the whole model: on a worker thread, as the check (which reads every value), so
    # long-polls are answered meanwhile.
    global_, _ = await asyncio.to_thread(decode, await store.global_blob(run_id), GlobalStateHeader)
    try:
        await asyncio.to_thread(check_contribution, algorithm, global_, header, tensors)
    except InvalidContent as exc:
        raise reject(exc) from exc
    outcome = await store.submit(header, blob, algorithm.synchronous)
    if outcome.duplicate:
        note_outcome(request, "duplicate")
    orchestrator.notify()
    return SubmitReceipt(accepted=outcome.accepted, duplicate=outcome.duplicate, buffered=outcome.buffered)
