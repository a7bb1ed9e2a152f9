"""Bounded request bodies (BodyLimit: 413 past the size, 408 past the deadline), JSON and safetensors
messages read by the route itself, and binary replies."""
from __future__ import annotations

import asyncio
import json
import math
import time
from typing import Any, Callable

from fastapi import HTTPException, Request, status
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from fl_services.shared.core.records import Record, decode
from fl_services.shared.core.tensors import InvalidContent, M, PayloadError
from fl_services.shared.wire.protocol import SAFETENSORS


class _TooLarge(HTTPException):
    # An HTTPException, so FastAPI's body parsing re-raises it (rather than answering 400) and its
    # exception handler turns it into the 413 response.
    def __init__(self, limit: int, declared: int | None = None):
        super().__init__(status.HTTP_413_CONTENT_TOO_LARGE,
                         f"payload exceeds the limit of {limit} bytes" if declared is None
                         else f"payload of {declared} bytes exceeds the limit of {limit}")


def _declared_length(scope: Scope) -> int | None:
    """The request's Content-Length (None: not given); ValueError if it is not a number."""
    declared = dict(scope["headers"]).get(b"content-length")
    if declared is None:
        return None
    if not declared.isdigit():
        raise ValueError("invalid Content-Length")
    return int(declared)


class _TooSlow(HTTPException):
    def __init__(self, timeout_s: float):
        super().__init__(status.HTTP_408_REQUEST_TIMEOUT, f"the request body did not arrive within {timeout_s:g} s")


class BodyLimit:
    """ASGI middleware: any request body over `limit` bytes gets 413 before it is all in memory, and one
    that has not all arrived `timeout_s` after the request began gets 408 (a client trickling its body a
    byte at a time holds a connection no longer than that).

    It checks the declared Content-Length first and then counts what actually arrives, so a chunked
    or lying upload is cut off as well; JSON and binary routes are covered alike. (Routes read less:
    `read_body`. The request head's deadline is the server's: shared/server/deadlines.py.)
    """

    def __init__(self, app: ASGIApp, limit: int, timeout_s: float = math.inf):
        self.app = app
        self.limit = limit
        self.timeout_s = timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        try:
            declared = _declared_length(scope)
        except ValueError as exc:
            return await _answer(scope, receive, send, 400, str(exc))
        if declared is not None and declared > self.limit:
            too_large = _TooLarge(self.limit, declared)
            return await _answer(scope, receive, send, too_large.status_code, too_large.detail)
        received, started, complete = 0, False, False
        deadline = time.monotonic() + self.timeout_s

        async def counting_receive() -> Message:
            nonlocal received, complete
            if complete:  # what comes now is the disconnect a streaming response listens for: no deadline
                return await receive()
            try:
                async with asyncio.timeout(deadline - time.monotonic()):
                    message = await receive()
            except TimeoutError:
                raise _TooSlow(self.timeout_s) from None
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.limit:
                    raise _TooLarge(self.limit)
                complete = not message.get("more_body", False)
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counting_receive, tracking_send)
        except (_TooLarge, _TooSlow) as exc:  # raised where no exception handler runs (e.g. in another middleware)
            if not started:
                await _answer(scope, receive, send, exc.status_code, exc.detail)


async def _answer(scope: Scope, receive: Receive, send: Send, code: int, detail: str) -> None:
    await JSONResponse({"detail": detail}, status_code=code)(scope, receive, send)


async def read_body(request: Request, limit: int) -> bytes:
    """The request's body, refused (413) as soon as it is known to exceed `limit` bytes: from its
    Content-Length before anything is read, else once that much has arrived. Read once: later calls
    (the route after its token check) get the same bytes."""
    kept: bytes | None = getattr(request.state, "body", None)
    if kept is not None:
        return kept
    declared = _declared_length(request.scope)  # a non-number was answered 400 by BodyLimit
    if declared is not None and declared > limit:
        raise _TooLarge(limit, declared)
    chunks, size = [], 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise _TooLarge(limit)
            chunks.append(chunk)
    except ClientDisconnect as exc:
        # The caller gave up mid-upload (an edge drops its contribution when the run stops): a 4xx no one
        # reads, not a 500 logged with its traceback as an unexpected error.
        raise HTTPException(status.HTTP_400_BAD_REQUEST, "the connection closed before the whole body arrived") from exc
    request.state.body = body = b"".join(chunks)
    return body


async def read_message(request: Request, message_type: type[M]) -> tuple[Record, M, bytes]:
    """A binary message from the body: 400 if unreadable, 422 if the header is invalid (413: BodyLimit).
    Decoding copies every tensor: on a worker thread, so the loop keeps answering long-polls meanwhile."""
    blob = await read_body(request, request.app.state.max_payload_bytes)
    try:
        tensors, header = await asyncio.to_thread(decode, blob, message_type)
    except InvalidContent as exc:
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, str(exc)) from exc
    except PayloadError as exc:
        raise HTTPException(status.HTTP_400_BAD_REQUEST, str(exc)) from exc
    return tensors, header, blob


# JSON bodies larger than this are parsed on a worker thread: the loop keeps answering long-polls meanwhile.
_PARSE_ON_LOOP_BYTES = 64 * 2**10


async def read_json(request: Request, model: type[M], parse: Callable[[Any], M] | None = None) -> M:
    """A JSON body read by the route itself, after its dependencies (the token check) have run: FastAPI
    parses a declared body first, so a bad token with a malformed body would get 422, not 401. At most
    `model.max_body_bytes` are read (413 beyond). `parse` replaces `model.model_validate` where a model
    needs checks it cannot make itself (a RunConfig's algorithm); its ValidationError is a 422 all the same."""
    body = await read_body(request, getattr(model, "max_body_bytes", _PARSE_ON_LOOP_BYTES))
    if len(body) > _PARSE_ON_LOOP_BYTES:
        return await asyncio.to_thread(_parse_json, body, parse or model.model_validate)
    return _parse_json(body, parse or model.model_validate)


def _parse_json(body: bytes, parse: Callable[[Any], M]) -> M:
    try:
        data = json.loads(body)
    except RecursionError as exc:
        raise HTTPException(status.HTTP_400_BAD_REQUEST, "JSON body nested too deeply") from exc
    except ValueError as exc:  # as FastAPI words it for a declared body
        error = exc.msg if isinstance(exc, json.JSONDecodeError) else str(exc)
        raise RequestValidationError([{"type": "json_invalid", "loc": ("body", getattr(exc, "pos", 0)),
                                       "msg": "JSON decode error", "input": {}, "ctx": {"error": error}}]) from exc
    try:
        return parse(data)
    except ValidationError as exc:
        raise RequestValidationError([{**e, "loc": ("body", *e["loc"])}
                                      for e in exc.errors(include_url=False)]) from exc


def binary(blob: bytes, headers: dict[str, str] | None = None) -> Response:
    return Response(blob, media_type=SAFETENSORS, headers=headers)


def reject(exc: InvalidContent) -> HTTPException:
    return HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, str(exc))


def same_as_url(named: str, value: int, url_value: int) -> None:
    """422 unless the id a message carries (`named`: where, e.g. "header edge_id") is the one its URL names."""
    if value != url_value:
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT,
                            f"{named} {value} does not match the URL's {url_value}")
