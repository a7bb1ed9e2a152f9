"""HTTP pieces both servers (cloud and edge) use: bearer auth, bounded body reads, binary replies."""
from __future__ import annotations

import secrets
from typing import Callable

from fastapi import HTTPException, Request, status
from fastapi.responses import Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from shared.transport.tensors import InvalidContent, M, PayloadError, Tensors, decode

SAFETENSORS = "application/vnd.safetensors"
_bearer = HTTPBearer(auto_error=False)


def bearer_guard(expected: Callable[[Request], str]):
    """A dependency that admits requests carrying `Authorization: Bearer <expected(request)>`."""

    async def guard(request: Request) -> None:
        creds: HTTPAuthorizationCredentials | None = await _bearer(request)
        if creds is None:
            raise HTTPException(status.HTTP_401_UNAUTHORIZED, "missing bearer token",
                                headers={"WWW-Authenticate": "Bearer"})
        if not secrets.compare_digest(creds.credentials.encode(), expected(request).encode()):
            raise HTTPException(status.HTTP_401_UNAUTHORIZED, "invalid bearer token",
                                headers={"WWW-Authenticate": "Bearer"})

    return guard


async def read_body(request: Request, limit: int) -> bytes:
    """Reads at most `limit` bytes; a larger body is refused with 413 before it is all in memory."""
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            if int(declared) > limit:
                raise HTTPException(status.HTTP_413_REQUEST_ENTITY_TOO_LARGE,
                                    f"payload of {declared} bytes exceeds the limit of {limit}")
        except ValueError:
            raise HTTPException(status.HTTP_400_BAD_REQUEST, "invalid Content-Length") from None
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise HTTPException(status.HTTP_413_REQUEST_ENTITY_TOO_LARGE,
                                f"payload exceeds the limit of {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


async def read_message(request: Request, limit: int, message_type: type[M]) -> tuple[Tensors, M, bytes]:
    """A binary message from the body: 413 if too large, 400 if unreadable, 422 if the header is invalid."""
    blob = await read_body(request, limit)
    try:
        tensors, header = decode(blob, message_type)
    except InvalidContent as exc:
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, str(exc)) from exc
    except PayloadError as exc:
        raise HTTPException(status.HTTP_400_BAD_REQUEST, str(exc)) from exc
    return tensors, header, blob


def binary(blob: bytes, headers: dict[str, str] | None = None) -> Response:
    return Response(blob, media_type=SAFETENSORS, headers=headers)


def reject(exc: InvalidContent) -> HTTPException:
    return HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, str(exc))
