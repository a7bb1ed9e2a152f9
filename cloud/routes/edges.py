"""Edge-facing API: register, long-poll the global state, submit a contribution to the buffer."""
from __future__ import annotations

from fastapi import HTTPException, Path, Request, Response, status

from fl_services.cloud.deps import (
    ContributionDep,
    KnownEdge,
    OrchestratorDep,
    StatePollDep,
    StoppingDep,
    StoreDep,
    require_edge,
)
from fl_services.cloud.services import contributions, edges
from fl_services.cloud.storage import MembersElsewhere
from fl_services.shared.core.tensors import InvalidContent
from fl_services.shared.server.auth import guarded_router
from fl_services.shared.server.bodies import binary, read_json, reject
from fl_services.shared.server.docs import binary_answer_doc, binary_body_doc, json_body_doc
from fl_services.shared.server.errors import error_responses
from fl_services.shared.server.longpoll import PollTimeout
from fl_services.shared.server.metrics import note_outcome
from fl_services.shared.server.quotas import rate_limited
from fl_services.shared.wire.edge_cloud import EdgeRegistration, RunEnd, SubmitReceipt
from fl_services.shared.wire.protocol import LIVE_RUNS, MEMBERS_ELSEWHERE, members_elsewhere_text

router = guarded_router(require_edge, prefix="/api/v1", tags=["edges"])


@router.post("/edges", responses=error_responses(400, 408, 409, 413, 422, 429),
             openapi_extra=json_body_doc(EdgeRegistration))
async def register(request: Request, store: StoreDep) -> EdgeRegistration:
    """Registers the edge, and its site (name, labels, devices, last round): an edge repeats it as its report."""
    reg = await read_json(request, EdgeRegistration)  # after the token check
    await rate_limited(request, "registration", reg.edge_id)
    await edges.register(store=store, registration=reg)
    return reg


@router.get("/edges/revoked-tokens")
async def revoked_token_ids(store: StoreDep) -> list[str]:
    """The ids of the revoked device tokens, which each edge refreshes and refuses."""
    return [r.token_id for r in await store.revoked_tokens()]


@router.get("/edges/{edge_id}/global", response_class=Response, responses={
    **binary_answer_doc("the global state of a run (its header says which run and version)",
                        headers={LIVE_RUNS: {"description": "the live runs this edge takes part in, comma-separated",
                                             "schema": {"type": "string"}}}),
    204: {"description": "nothing newer before the timeout, or a run the edge knows has ended"},
    **error_responses(404, 422)})
async def global_state(edge_id: KnownEdge, poll: StatePollDep, timeout: PollTimeout, request: Request,
                       store: StoreDep, orchestrator: OrchestratorDep, stopping: StoppingDep) -> Response:
    """Long-poll: answers as soon as a live run this edge takes part in has a version it has not seen, or at
    once if a run it knows (seen or busy) has ended (stopped, finished): the edge then drops that run."""
    found = await edges.global_state(store=store, orchestrator=orchestrator, stopping=stopping, edge_id=edge_id,
                                     poll=poll, timeout=timeout, gone=request.is_disconnected)
    headers = {LIVE_RUNS: ",".join(found.live)}
    if found.blob is None:
        return Response(status_code=status.HTTP_204_NO_CONTENT, headers=headers)
    return binary(found.blob, headers=headers)


@router.get("/edges/{edge_id}/runs/{run_id}/end", response_model=RunEnd, responses={
    204: {"description": "the run still trains at the timeout"}, **error_responses(404, 422)})
async def run_end(edge_id: KnownEdge, timeout: PollTimeout, store: StoreDep, orchestrator: OrchestratorDep,
                  stopping: StoppingDep, run_id: str = Path(min_length=1, max_length=64)) -> RunEnd | Response:
    """Long-poll an edge keeps open while it runs a round of `run_id`: answers as soon as that run no longer
    trains (stopped, finished or deleted), so that the edge drops the round at once instead of learning of a
    stop at the round's deadline (up to a day) while its clients train for nothing."""
    end = await edges.run_end(store=store, orchestrator=orchestrator, stopping=stopping, run_id=run_id,
                              timeout=timeout)
    return end if end is not None else Response(status_code=status.HTTP_204_NO_CONTENT)


@router.post("/edges/{edge_id}/contributions", status_code=status.HTTP_202_ACCEPTED,
             responses=error_responses(400, 404, 408, 409, 413, 422, 429), openapi_extra=binary_body_doc())
async def submit(contribution: ContributionDep, request: Request, store: StoreDep,
                 orchestrator: OrchestratorDep) -> SubmitReceipt:
    """Accepts an edge's contribution into the run's buffer (idempotent per idempotency key)."""
    try:
        outcome = await contributions.submit(store=store, orchestrator=orchestrator, contribution=contribution)
    except InvalidContent as exc:
        raise reject(exc) from exc
    except MembersElsewhere as exc:
        note_outcome(request, "member_elsewhere")
        raise HTTPException(status.HTTP_409_CONFLICT, str(exc),
                            headers={MEMBERS_ELSEWHERE: members_elsewhere_text(exc.holders)}) from exc
    if outcome.duplicate:
        note_outcome(request, "duplicate")
    return SubmitReceipt(accepted=outcome.accepted, duplicate=outcome.duplicate, buffered=outcome.buffered)
