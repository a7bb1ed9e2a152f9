"""Client-facing API: register, long-poll a task, push a result. Clients only ever dial out."""
from __future__ import annotations

from fastapi import APIRouter, HTTPException, Query, Request, Response, status

from edge.deps import BoardDep, SettingsDep, require_client
from shared.schemas import ClientRegistration, ClientResultHeader, ResultReceipt
from shared.transport.tensors import InvalidContent
from shared.web import binary, read_message, reject

router = APIRouter(prefix="/api/v1/clients", tags=["clients"], dependencies=[require_client])


@router.post("")
async def register(reg: ClientRegistration, board: BoardDep) -> ClientRegistration:
    board.register(reg)
    return reg


@router.get("/{client_id}/task", responses={204: {"description": "no task before the timeout"}})
async def task(client_id: int, board: BoardDep, settings: SettingsDep, timeout: float = Query(20.0, ge=0)):
    found = await board.fetch(client_id, min(timeout, settings.long_poll_max_s))
    if found is None:
        return Response(status_code=status.HTTP_204_NO_CONTENT)
    return binary(found.blob())


@router.post("/{client_id}/results", status_code=status.HTTP_202_ACCEPTED)
async def result(client_id: int, request: Request, board: BoardDep, settings: SettingsDep) -> ResultReceipt:
    tensors, header, _ = await read_message(request, ClientResultHeader)
    if header.client_id != client_id:
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT,
                            f"header client_id {header.client_id} does not match the URL's {client_id}")
    try:
        await board.accept(client_id, header, tensors)
    except InvalidContent as exc:
        raise reject(exc) from exc
    return ResultReceipt(accepted=True)
