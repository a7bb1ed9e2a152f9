"""Client-facing API: register, long-poll a task, push a result. Clients only ever dial out."""
from __future__ import annotations

import asyncio
from functools import partial

from fastapi import Depends, Request, Response, status

from fl_services.edge.deps import BoardDep, ClientAuthDep, MetricsDep, RoundLoopDep, client_auth
from fl_services.edge.services import clients
from fl_services.shared.core.tensors import InvalidContent
from fl_services.shared.server.auth import guarded_router
from fl_services.shared.server.bodies import binary, read_json, read_message, reject, same_as_url
from fl_services.shared.server.docs import binary_body_doc, json_body_doc
from fl_services.shared.server.errors import error_responses
from fl_services.shared.server.longpoll import PollTimeout, capped_wait
from fl_services.shared.server.quotas import open_request, rate_limited
from fl_services.shared.wire.client_edge import (
    ClientFailureReport,
    ClientRegistration,
    ClientResultHeader,
    ResultReceipt,
    TaskPoll,
)
from fl_services.shared.wire.protocol import TASK_BUNDLE

# Every route checks the caller's token: the edge's client secret, or the own token of the client that
# the route names (registration: the body's client_id); anything else is 401.
router = guarded_router(Depends(client_auth), prefix="/api/v1/clients", tags=["clients"])


@router.post("", responses=error_responses(400, 408, 409, 413, 422, 429),
             openapi_extra=json_body_doc(ClientRegistration))
async def register(request: Request, board: BoardDep, loop: RoundLoopDep) -> ClientRegistration:
    reg = await read_json(request, ClientRegistration)  # after the token check
    await rate_limited(request, "registration", reg.client_id)
    clients.register(board=board, loop=loop, registration=reg)
    return reg


@router.get("/{client_id}/task", responses={204: {"description": "no task before the timeout"},
                                            **error_responses(404, 422, 429)})
async def task(client_id: int, request: Request, board: BoardDep, timeout: PollTimeout):
    async with open_request(request, "task", client_id):
        found = await board.fetch(client_id, timeout)
    if found is None:
        return Response(status_code=status.HTTP_204_NO_CONTENT)
    return binary(await asyncio.to_thread(found.blob))  # encoded on first fetch


@router.post("/tasks", responses={200: {"content": {TASK_BUNDLE: {}}, "description": "the tasks, as a bundle"},
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
async def failure(client_id: int, request: Request, board: BoardDep) -> ResultReceipt:
    """A task the client could not train: the round stops waiting for it and its record says why."""
    await rate_limited(request, "result", client_id)  # a failure answers a task as a result does
    report = await read_json(request, ClientFailureReport)  # after the token check
    same_as_url("report client_id", report.client_id, client_id)
    await board.report_failure(client_id, report)
    return ResultReceipt(accepted=True)
