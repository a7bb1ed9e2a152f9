"""Every error answer: documented in the OpenAPI, small and safe to render (a 4xx never echoes a whole body)."""
from __future__ import annotations

import itertools
import math
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import Request, status
from fastapi.encoders import jsonable_encoder
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException

from fl_services.shared.server.metrics import note_outcome


class ErrorDetail(BaseModel):
    """Every error answer: a message, or (a 422 for invalid input) FastAPI's list of what is wrong where."""
    detail: str | list[dict[str, Any]]


_ERRORS = {
    400: "unreadable body (bad JSON or safetensors framing, bad Content-Length)",
    401: "missing or invalid bearer token",
    403: "a valid token without the right to this route (a device's own token on an operator's route)",
    404: "unknown run, edge or client",
    409: "conflicts with the current state (e.g. a run's status, a stale or duplicate result)",
    408: "the request body did not arrive within the service's body_timeout_s",
    413: "body over the route's limit: the service's max_payload_bytes for tensors, a few KiB for a registration",
    422: "invalid input: the body, header or parameters fail validation",
    429: "more requests from this client (or edge) than the service's rate_limit; see Retry-After",
}


def error_responses(*codes: int) -> dict[int | str, dict[str, Any]]:
    """The OpenAPI `responses` of the error statuses a route (or a router's every route) can answer."""
    return {code: {"model": ErrorDetail, "description": _ERRORS[code]} for code in codes}


# What a 4xx says back at most: this many of a 422's errors, this many characters of any text or input.
_MAX_ERRORS = 20


_MAX_ECHO = 200


# How far into a container an error's quoted input goes: this many levels, this many items a level.
_ECHO_DEPTH = 3


_ECHO_ITEMS = 4


async def _invalid_request(_: Request, exc: RequestValidationError) -> JSONResponse:
    """FastAPI's 422, made small and safe to render. Its errors echo the input: a 60 MB body would take a
    minute to be written back whole, so each error quotes at most a short excerpt, and only the first few errors
    are listed. An input such as 1e400 (inf) or a lone surrogate cannot be written as JSON at all (the 422
    would become a 500 and the connection would drop), so such values are quoted as text."""
    errors = list(exc.errors())
    shown = [{key: _brief(value) for key, value in error.items()} for error in errors[:_MAX_ERRORS]]
    if len(errors) > _MAX_ERRORS:
        shown.append({"type": "too_many_errors", "loc": [], "msg": f"{len(errors) - _MAX_ERRORS} more not shown"})
    return JSONResponse({"detail": _json_safe(jsonable_encoder(shown))},
                        status_code=status.HTTP_422_UNPROCESSABLE_CONTENT)


def _brief(value: Any, depth: int = _ECHO_DEPTH) -> Any:
    """A value an error quotes back, cut short and as JSON (the caller sent JSON): a long text truncated, a
    container's first few items a few levels deep (the rest counted, never walked), anything else as its text."""
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    if isinstance(value, str):
        return value if len(value) <= _MAX_ECHO else value[:_MAX_ECHO] + f"… ({len(value)} characters)"
    if value is None or isinstance(value, (bool, int, float)):
        return value
    if isinstance(value, (list, tuple)) and all(isinstance(v, (str, int)) for v in value[:_MAX_ERRORS])\
            and len(value) <= _MAX_ERRORS:  # a location: its parts, each cut short
        return [_brief(v) for v in value]
    if isinstance(value, dict):
        if depth == 0:
            return f"{{…}} ({len(value)} keys)"
        shown = {str(_brief(k)): _brief(v, depth - 1) for k, v in itertools.islice(value.items(), _ECHO_ITEMS)}
        if len(value) > _ECHO_ITEMS:
            shown["…"] = f"{len(value) - _ECHO_ITEMS} more keys"
        return shown
    if isinstance(value, (list, tuple, set, frozenset)):
        if depth == 0:
            return f"[…] ({len(value)} items)"
        items = [_brief(v, depth - 1) for v in itertools.islice(value, _ECHO_ITEMS)]
        return items + ([f"… {len(value) - _ECHO_ITEMS} more items"] if len(value) > _ECHO_ITEMS else [])
    return _brief(str(value))


async def _http_error(request: Request, exc: StarletteHTTPException) -> Response:
    """Starlette's answer to an HTTPException, with a text detail cut short: details quote what was wrong
    (a header's validation errors, a parser's message), which may be large."""
    if isinstance(exc.detail, str) and len(exc.detail) > 4 * _MAX_ECHO:
        exc.detail = exc.detail[:4 * _MAX_ECHO] + f"… ({len(exc.detail)} characters)"
    return await http_exception_handler(request, exc)


def _json_safe(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, str):
        return value.encode("utf-8", "replace").decode("utf-8")
    if isinstance(value, dict):
        return {_json_safe(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_safe(v) for v in value]
    return value


def _answer_with(status_code: int) -> Callable[[Request, Exception], Awaitable[JSONResponse]]:
    async def handler(request: Request, exc: Exception) -> JSONResponse:
        reason = getattr(exc, "reason", None)  # a refusal's own name (e.g. "stale"), for the metrics
        if reason is not None:
            note_outcome(request, reason)
        return JSONResponse({"detail": _brief(str(exc))}, status_code=status_code)

    return handler
