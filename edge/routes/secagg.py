"""Secure aggregation's steps for a device (edge/secagg.py): it posts its keys, shares, masked input and unmasking
shares, and long-polls what the edge relays after each step. Devices only ever dial out."""
from __future__ import annotations

from collections.abc import Awaitable, Callable
from functools import partial
from typing import TypeVar

from fastapi import Depends, Request, Response, status

from fl_services.edge.deps import BoardDep, RoundLoopDep, client_auth
from fl_services.edge.services import secagg
from fl_services.shared.core.records import Record
from fl_services.shared.core.tensors import InvalidContent
from fl_services.shared.server.auth import guarded_router
from fl_services.shared.server.bodies import read_json, read_message, reject, same_as_url
from fl_services.shared.server.docs import binary_body_doc, json_body_doc
from fl_services.shared.server.errors import error_responses
from fl_services.shared.server.longpoll import PollTimeout
from fl_services.shared.server.quotas import open_request, rate_limited
from fl_services.shared.wire.client_edge import ResultReceipt
from fl_services.shared.wire.secagg import SecAggKeys, SecAggMaskedHeader, SecAggShares, SecAggStep, SecAggUnmask, Step

T = TypeVar("T")
router = guarded_router(Depends(client_auth), prefix="/api/v1/clients/{client_id}/secagg/{task_id}", tags=["secagg"])
POSTED = error_responses(400, 404, 408, 409, 413, 422, 429)


async def _accepted(request: Request, client_id: int, read: Callable[[], Awaitable[T]],
                    add: Callable[[T], Awaitable[None]]) -> ResultReceipt:
    """A step's message read and handed to the protocol: 422 if it breaks the protocol, 409 once its step closed."""
    await rate_limited(request, "result", client_id)  # before its body is read
    async with open_request(request, "result", client_id):
        body = await read()
        try:
            await add(body)
        except InvalidContent as exc:
            raise reject(exc) from exc
    return ResultReceipt(accepted=True)


@router.post("/keys", status_code=status.HTTP_202_ACCEPTED, responses=POSTED, openapi_extra=json_body_doc(SecAggKeys))
async def keys(client_id: int, task_id: str, request: Request, board: BoardDep, loop: RoundLoopDep) -> ResultReceipt:
    """Step 0, after training: the device's public keys and its result's header (which answers its task)."""
    return await _accepted(request, client_id, partial(read_json, request, SecAggKeys), lambda body: secagg.add_keys(
        loop=loop, board=board, client_id=client_id, task_id=task_id, keys=body))


@router.post("/shares", status_code=status.HTTP_202_ACCEPTED, responses=POSTED,
             openapi_extra=json_body_doc(SecAggShares))
async def shares(client_id: int, task_id: str, request: Request, loop: RoundLoopDep) -> ResultReceipt:
    """Step 1: the device's encrypted shares, one per roster member, and its commitment to its mask seed."""
    return await _accepted(request, client_id, partial(read_json, request, SecAggShares),
                           lambda body: secagg.add_shares(loop=loop, client_id=client_id, task_id=task_id, shares=body))


@router.post("/masked", status_code=status.HTTP_202_ACCEPTED, responses=POSTED, openapi_extra=binary_body_doc())
async def masked(client_id: int, task_id: str, request: Request, loop: RoundLoopDep) -> ResultReceipt:
    """Step 2: the device's masked input (safetensors: one int64 vector, with a SecAggMaskedHeader)."""
    async def read() -> Record:
        tensors, header, _ = await read_message(request, SecAggMaskedHeader)
        same_as_url("header client_id", header.client_id, client_id)
        return tensors

    return await _accepted(request, client_id, read, lambda body: secagg.add_masked(
        loop=loop, client_id=client_id, task_id=task_id, tensors=body))


@router.post("/unmask", status_code=status.HTTP_202_ACCEPTED, responses=POSTED,
             openapi_extra=json_body_doc(SecAggUnmask))
async def unmask(client_id: int, task_id: str, request: Request, loop: RoundLoopDep) -> ResultReceipt:
    """Step 3: the device's shares of the dropped devices' keys and of the remaining devices' seeds."""
    return await _accepted(request, client_id, partial(read_json, request, SecAggUnmask),
                           lambda body: secagg.add_unmask(loop=loop, client_id=client_id, task_id=task_id, unmask=body))


@router.get("/{step}", responses={204: {"description": "the step has not closed before the timeout"},
                                  **error_responses(404, 409, 422, 429)})
async def relayed(client_id: int, task_id: str, step: Step, request: Request, loop: RoundLoopDep,
                  timeout: PollTimeout) -> Response:
    """What the edge relays to the device once `step` closes: the roster, its inbox, the remaining devices."""
    async with open_request(request, "task", client_id):
        found: SecAggStep | None = await secagg.wait_step(loop=loop, client_id=client_id, task_id=task_id,
                                                          step=step, timeout=timeout)
    if found is None:
        return Response(status_code=status.HTTP_204_NO_CONTENT)
    return Response(found.model_dump_json(), media_type="application/json")
