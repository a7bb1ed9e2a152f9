"""Client-facing API: register, long-poll a task, push a result. Clients only ever dial out."""
from __future__ import annotations

import asyncio
from typing import Annotated

from fastapi import Depends, HTTPException, Query, Request, Response, status

from fl_services.edge.deps import BoardDep, ClientAuth, RoundLoopDep, SettingsDep, client_auth
from fl_services.shared.core.tensors import InvalidContent
from fl_services.shared.server.auth import guarded_router, unauthorized
from fl_services.shared.server.bodies import binary, read_json, read_message, reject
from fl_services.shared.server.docs import binary_body_doc, json_body_doc
from fl_services.shared.server.errors import error_responses
from fl_services.shared.server.quotas import open_request, rate_limited
from fl_services.shared.wire import bundle
from fl_services.shared.wire.client_edge import (
    ClientFailureReport,
    ClientRegistration,
    ClientResultHeader,
    ResultReceipt,
    TaskPoll,
)
from fl_services.shared.wire.protocol import LIVE_RUNS, REFUSED_CLIENTS, TASK_BUNDLE, UNKNOWN_CLIENTS

# Every route checks the caller's token: the edge's client secret, or the own token of the client that
# the route names (registration: the body's client_id); anything else is 401.
router = guarded_router(Depends(client_auth), prefix="/api/v1/clients", tags=["clients"])


@router.post("", responses=error_responses(400, 408, 409, 413, 422, 429),
             openapi_extra=json_body_doc(ClientRegistration))
async def register(request: Request, board: BoardDep, loop: RoundLoopDep) -> ClientRegistration:
    reg = await read_json(request, ClientRegistration)  # after the token check
    await rate_limited(request, "registration", reg.client_id)
    loop.check_own_client(reg.client_id)
    board.register(reg)
    return reg


@router.get("/{client_id}/task", responses={204: {"description": "no task before the timeout"},
                                            **error_responses(404, 422, 429)})
async def task(client_id: int, request: Request, board: BoardDep, settings: SettingsDep,
               timeout: float = Query(20.0, ge=0)):
    async with open_request(request, "task", client_id):
        found = await board.fetch(client_id, min(timeout, settings.long_poll_max_s))
    if found is None:
        return Response(status_code=status.HTTP_204_NO_CONTENT)
    return binary(await asyncio.to_thread(found.blob))  # encoded on first fetch


@router.post("/tasks", responses={200: {"content": {TASK_BUNDLE: {}}, "description": "the tasks, as a bundle"},
                                  204: {"description": "no task before the timeout"},
                                  **error_responses(400, 408, 413, 422, 429)},
             openapi_extra=json_body_doc(TaskPoll))
async def tasks(request: Request, board: BoardDep, settings: SettingsDep, loop: RoundLoopDep,
                auth: Annotated[ClientAuth, Depends(client_auth)]) -> Response:
    """A client process's one long-poll for all its logical clients: every open task of theirs but those it
    holds (shared/wire/bundle.py). Ids the edge does not know are named in X-FL-Unknown-Clients, ids whose
    token it refuses in X-FL-Refused-Clients (401 if it refuses all)."""
    poll = await read_json(request, TaskPoll)  # after the token check (each id's token, or the secret)
    refusals = {k: reason for k in poll.client_ids if (reason := auth.refusal(k, poll.tokens.get(k))) is not None}
    if len(refusals) == len(poll.client_ids):
        raise unauthorized(next(iter(refusals.values())))
    served = [k for k in poll.client_ids if k not in refusals]
    unknown = [k for k in served if k not in board.clients]
    # With clients to register again (the edge restarted), the process hears of them at once, not after the wait.
    timeout = 0 if unknown or refusals else min(poll.timeout, settings.long_poll_max_s)
    # Counted with the per-client long-polls of its first id: a device (its token names one id) holds at most
    # max_open_per_caller polls by either route; a process of many ids holds one.
    async with open_request(request, "task", served[0]):
        found = await board.fetch_many(served, set(poll.holding), timeout)
    headers = {name: ",".join(map(str, ids)) for name, ids in ((UNKNOWN_CLIENTS, unknown), (REFUSED_CLIENTS,
                                                                                            list(refusals))) if ids}
    if loop.live_runs is not None:  # only once the cloud has named them: the client deletes the others' state
        headers[LIVE_RUNS] = ",".join(sorted(loop.live_runs))
    if not found:
        return Response(status_code=status.HTTP_204_NO_CONTENT, headers=headers)
    body = await asyncio.to_thread(lambda: bundle.pack([(t.header.client_id, t.header.task_id, *t.parts())
                                                        for t in found]))
    return Response(body, media_type=TASK_BUNDLE, headers=headers)


@router.post("/{client_id}/results", status_code=status.HTTP_202_ACCEPTED,
             responses=error_responses(400, 404, 408, 409, 413, 422, 429), openapi_extra=binary_body_doc())
async def result(client_id: int, request: Request, board: BoardDep) -> ResultReceipt:
    await rate_limited(request, "result", client_id)  # before its body is read
    async with open_request(request, "result", client_id):  # each upload may hold max_payload_bytes in memory
        tensors, header, _ = await read_message(request, ClientResultHeader)
        if header.client_id != client_id:
            raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT,
                                f"header client_id {header.client_id} does not match the URL's {client_id}")
        try:
            await board.accept(client_id, header, tensors)  # checks the tensors on a worker thread too
        except InvalidContent as exc:
            raise reject(exc) from exc
    request.app.state.metrics.trained(header)
    return ResultReceipt(accepted=True)


@router.post("/{client_id}/failures", status_code=status.HTTP_202_ACCEPTED,
             responses=error_responses(400, 404, 408, 409, 413, 422, 429),
             openapi_extra=json_body_doc(ClientFailureReport))
async def failure(client_id: int, request: Request, board: BoardDep) -> ResultReceipt:
    """A task the client could not train: the round stops waiting for it and its record says why."""
    await rate_limited(request, "result", client_id)  # a failure answers a task as a result does
    report = await read_json(request, ClientFailureReport)  # after the token check
    if report.client_id != client_id:
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT,
                            f"report client_id {report.client_id} does not match the URL's {client_id}")
    await board.report_failure(client_id, report)
    return ResultReceipt(accepted=True)
