"""Client-facing API: register, long-poll a task, push a result. Clients only ever dial out."""
from __future__ import annotations

import asyncio

from fastapi import Depends, HTTPException, Query, Request, Response, status

from edge.deps import BoardDep, RoundLoopDep, SettingsDep, client_auth
from shared import web
from shared.schemas import ClientFailureReport, ClientRegistration, ClientResultHeader, ResultReceipt
from shared.transport.tensors import InvalidContent
from shared.web import binary, open_request, rate_limited, read_json, read_message, reject

# Every route checks the caller's token: the edge's client secret, or the own token of the client that
# the route names (registration: the body's client_id); anything else is 401.
router = web.guarded_router(Depends(client_auth), prefix="/api/v1/clients", tags=["clients"])


@router.post("", responses=web.error_responses(400, 408, 409, 413, 422, 429),
             openapi_extra=web.json_body_doc(ClientRegistration))
async def register(request: Request, board: BoardDep, loop: RoundLoopDep) -> ClientRegistration:
    reg = await read_json(request, ClientRegistration)  # after the token check
    await rate_limited(request, "registration", reg.client_id)
    loop.check_own_client(reg.client_id)
    board.register(reg)
    return reg


@router.get("/{client_id}/task", responses={204: {"description": "no task before the timeout"},
                                            **web.error_responses(404, 422, 429)})
async def task(client_id: int, request: Request, board: BoardDep, settings: SettingsDep,
               timeout: float = Query(20.0, ge=0)):
    async with open_request(request, "task", client_id):
        found = await board.fetch(client_id, min(timeout, settings.long_poll_max_s))
    if found is None:
        return Response(status_code=status.HTTP_204_NO_CONTENT)
    return binary(await asyncio.to_thread(found.blob))  # encoded on first fetch


@router.post("/{client_id}/results", status_code=status.HTTP_202_ACCEPTED,
             responses=web.error_responses(400, 404, 408, 409, 413, 422, 429), openapi_extra=web.binary_body_doc())
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
             responses=web.error_responses(400, 404, 408, 409, 413, 422, 429),
             openapi_extra=web.json_body_doc(ClientFailureReport))
async def failure(client_id: int, request: Request, board: BoardDep) -> ResultReceipt:
    """A task the client could not train: the round stops waiting for it and its record says why."""
    await rate_limited(request, "result", client_id)  # a failure answers a task as a result does
    report = await read_json(request, ClientFailureReport)  # after the token check
    if report.client_id != client_id:
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT,
                            f"report client_id {report.client_id} does not match the URL's {client_id}")
    await board.report_failure(client_id, report)
    return ResultReceipt(accepted=True)
