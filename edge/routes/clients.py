"""Client-facing API: register, long-poll a task, push a result. Clients only ever dial out."""
from __future__ import annotations

import asyncio
from functools import partial

from fastapi import Depends, HTTPException, Request, Response, status

from fl_services.edge.deps import BoardDep, ClientAuthDep, MetricsDep, RoundLoopDep, client_auth
from fl_services.edge.services import clients
from fl_services.shared.core.tensors import InvalidContent, PayloadError
from fl_services.shared.server.auth import guarded_router
from fl_services.shared.server.bodies import binary, read_body, read_json, read_message, reject, same_as_url
from fl_services.shared.server.docs import binary_answer_doc, binary_body_doc, json_body_doc
from fl_services.shared.server.errors import error_responses
from fl_services.shared.server.longpoll import PollTimeout, capped_wait
from fl_services.shared.server.quotas import open_request, rate_limited
from fl_services.shared.wire import bundle
from fl_services.shared.wire.client_edge import (
    ClientFailureReport,
    ClientRegistration,
    ClientResultHeader,
    ResultBatchReceipt,
    ResultReceipt,
    TaskPoll,
)
from fl_services.shared.wire.protocol import RESULT_BUNDLE, TASK_BUNDLE

# Every route checks the caller's token: the edge's client secret, or the own token of the client that
# the route names (registration: the body's client_id); anything else is 401.
router = guarded_router(Depends(client_auth), prefix="/api/v1/clients", tags=["clients"])


@router.post("", responses=error_responses(400, 408, 409, 413, 422, 429),
             openapi_extra=json_body_doc(ClientRegistration))
async def register(request: Request, board: BoardDep, loop: RoundLoopDep, auth: ClientAuthDep) -> ClientRegistration:
    reg = await read_json(request, ClientRegistration)  # after the token check
    await rate_limited(request, "registration", reg.client_id)
    clients.register(board=board, loop=loop, registration=reg, token_id=auth.token_id(reg.client_id))
    return reg


@router.get("/{client_id}/task", response_class=Response, responses={
    **binary_answer_doc("the client's oldest open task (safetensors)"),
    204: {"description": "no task before the timeout"}, **error_responses(404, 422, 429)})
async def task(client_id: int, request: Request, board: BoardDep, timeout: PollTimeout) -> Response:
    async with open_request(request, "task", client_id):
        found = await board.fetch(client_id, timeout)
    if found is None:
        return Response(status_code=status.HTTP_204_NO_CONTENT)
    return binary(await asyncio.to_thread(found.blob))  # encoded on first fetch


@router.post("/tasks", response_class=Response, responses={**binary_answer_doc("the tasks, as a bundle", TASK_BUNDLE),
                                  204: {"description": "no task before the timeout"},
                                  **error_responses(400, 408, 413, 422, 429)},
             openapi_extra=json_body_doc(TaskPoll))
async def tasks(request: Request, board: BoardDep, loop: RoundLoopDep, auth: ClientAuthDep) -> Response:
    """A client process's one long-poll for all its logical clients: every open task of theirs but those it
    holds (shared/wire/bundle.py). Ids the edge does not know are named in X-FL-Unknown-Clients, ids whose
    token it refuses in X-FL-Refused-Clients (401 if it refuses all)."""
    poll = await read_json(request, TaskPoll)  # after the token check (each id's token, or the secret)
    reply = await clients.poll_tasks(board=board, loop=loop, poll=poll, refused=auth.refused(poll),
                                     wait_s=capped_wait(request, poll.timeout),
                                     hold=partial(open_request, request, "task"))
    if reply.bundle is None:
        return Response(status_code=status.HTTP_204_NO_CONTENT, headers=reply.headers)
    return Response(reply.bundle, media_type=TASK_BUNDLE, headers=reply.headers)


@router.post("/results", responses=error_responses(400, 408, 413, 429), openapi_extra=binary_body_doc(RESULT_BUNDLE))
async def results(request: Request, board: BoardDep, metrics: MetricsDep) -> ResultBatchReceipt:
    """A client process's results of many of its logical clients in one upload (a result bundle, shared/wire/bundle.py:
    each item a result message as the per-client route takes it), sent with the edge's client secret. Each result is
    taken or refused on its own: its outcome is the status the per-client route would have answered (202 accepted;
    409, 404, 422, 400, 429 refused, with the reason), and a refused result refuses nothing else. 400 for a body that
    is not a result bundle."""
    body = await read_body(request, request.app.state.max_payload_bytes)
    try:
        items = await asyncio.to_thread(bundle.unpack, body)
    except PayloadError as exc:
        raise HTTPException(status.HTTP_400_BAD_REQUEST, str(exc)) from exc
    if not items:
        raise HTTPException(status.HTTP_400_BAD_REQUEST, "the result bundle holds no result")

    async def over_rate(client_id: int) -> str | None:
        try:
            await rate_limited(request, "result", client_id)
        except HTTPException as exc:
            return str(exc.detail)
        return None

    # Counted with the per-client uploads of its first client: the body is held in memory while its results are taken.
    async with open_request(request, "result", items[0].client_id):
        outcomes = await clients.accept_results(board=board, metrics=metrics, items=items, over_rate=over_rate)
    return ResultBatchReceipt(results=outcomes)


@router.post("/{client_id}/results", status_code=status.HTTP_202_ACCEPTED,
             responses=error_responses(400, 404, 408, 409, 413, 422, 429), openapi_extra=binary_body_doc())
async def result(client_id: int, request: Request, board: BoardDep, metrics: MetricsDep) -> ResultReceipt:
    await rate_limited(request, "result", client_id)  # before its body is read
    async with open_request(request, "result", client_id):  # each upload may hold max_payload_bytes in memory
        with board.receiving(client_id):  # the device registry shows it uploading meanwhile
            tensors, header, _ = await read_message(request, ClientResultHeader)
        same_as_url("header client_id", header.client_id, client_id)
        try:
            await clients.accept_result(board=board, metrics=metrics, header=header, tensors=tensors)
        except InvalidContent as exc:
            raise reject(exc) from exc
    return ResultReceipt(accepted=True)


@router.post("/{client_id}/failures", status_code=status.HTTP_202_ACCEPTED,
             responses=error_responses(400, 404, 408, 409, 413, 422, 429),
             openapi_extra=json_body_doc(ClientFailureReport))
async def failure(client_id: int, request: Request, response: Response, board: BoardDep,
                  metrics: MetricsDep) -> ResultReceipt:
    """A task the client could not train: the round stops waiting for it and its record says why. A repeated
    report of the same task is 200 with accepted false: the first reason stays recorded."""
    await rate_limited(request, "result", client_id)  # a failure answers a task as a result does
    report = await read_json(request, ClientFailureReport)  # after the token check
    same_as_url("report client_id", report.client_id, client_id)
    if not await board.report_failure(client_id, report):
        response.status_code = status.HTTP_200_OK
        return ResultReceipt(accepted=False)
    metrics.client_failures.labels(report.kind).inc()
    return ResultReceipt(accepted=True)
