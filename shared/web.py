"""HTTP pieces both servers (cloud and edge) use: bearer auth, bounded body reads, binary replies, API docs
served offline, and serving with long-polls that end as soon as the process is told to stop. Server side
only: what the client and fedctl share with the servers is in shared/transport/wire.py."""
from __future__ import annotations

import asyncio
import collections
import json
import math
import reprlib
import resource
import secrets
import time
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any, Callable

import limits
import uvicorn
from fastapi import APIRouter, Depends, FastAPI, HTTPException, Request, status
from fastapi.encoders import jsonable_encoder
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse, JSONResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from fastapi.staticfiles import StaticFiles
from limits.aio.storage import MemoryStorage
from limits.aio.strategies import MovingWindowRateLimiter
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from shared.deadlines import h11_with_deadlines
from shared.metrics import RequestMetrics, ServiceMetrics, metrics_router, note_outcome
from shared.settings import ServerSettings
from shared.transport.records import Record, decode
from shared.transport.tensors import InvalidContent, M, PayloadError
from shared.transport.wire import SAFETENSORS

_bearer = HTTPBearer(auto_error=False)


def unauthorized(detail: str = "invalid bearer token") -> HTTPException:
    return HTTPException(status.HTTP_401_UNAUTHORIZED, detail, headers={"WWW-Authenticate": "Bearer"})


async def bearer_token(request: Request) -> str:
    """The request's bearer token, or 401."""
    creds: HTTPAuthorizationCredentials | None = await _bearer(request)
    if creds is None:
        raise unauthorized("missing bearer token")
    return creds.credentials


def same_token(given: str, expected: str) -> bool:
    return secrets.compare_digest(given.encode(), expected.encode())


def app_state(name: str) -> Callable[[Request], Any]:
    """A dependency that returns `app.state.<name>`, what the service's lifespan put there."""

    def get(request: Request) -> Any:
        return getattr(request.app.state, name)

    return get


def bearer_guard(expected: Callable[[Request], str]):
    """A dependency that admits requests carrying `Authorization: Bearer <expected(request)>`."""

    async def guard(request: Request) -> None:
        if not same_token(await bearer_token(request), expected(request)):
            raise unauthorized()

    return guard


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
    `read_body`. The request head's deadline is the server's: shared/deadlines.py.)
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
        # reads, where it was a 500 logged with its traceback ("Exception in ASGI application").
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


class RateLimit:
    """Requests per caller and route group, in a moving window (the `limits` package, kept in memory: each
    service process counts its own callers). Past the rate: 429 with Retry-After."""

    def __init__(self, rate: str):
        self.rate = limits.parse(rate)
        self._window = MovingWindowRateLimiter(MemoryStorage())

    async def check(self, group: str, caller: int | str) -> None:
        if not await self._window.hit(self.rate, group, str(caller)):
            reset_at = (await self._window.get_window_stats(self.rate, group, str(caller))).reset_time
            retry_s = max(1, math.ceil(reset_at - time.time()))
            raise HTTPException(status.HTTP_429_TOO_MANY_REQUESTS,
                                f"more than {self.rate} {group} requests for {caller}; retry in {retry_s} s",
                                headers={"Retry-After": str(retry_s)})


async def rate_limited(request: Request, group: str, caller: int | str) -> None:
    """429 if `caller` (the client or edge the request acts for) exceeds the service's rate in `group`."""
    await request.app.state.rate_limit.check(group, caller)


class OpenRequests:
    """Requests per caller and route group open at once (long-polls, uploads): past `limit`, 429 with
    Retry-After. Every caller shares the server's connections (max_connections): one device's token holding
    49 task long-polls on a 50-connection edge answered every other client, and /health, 503."""

    def __init__(self, limit: int):
        self.limit = limit
        self._open: collections.Counter[tuple[str, str]] = collections.Counter()

    @asynccontextmanager
    async def hold(self, group: str, caller: int | str) -> AsyncIterator[None]:
        key = (group, str(caller))
        if self._open[key] >= self.limit:
            raise HTTPException(status.HTTP_429_TOO_MANY_REQUESTS,
                                f"{self.limit} {group} requests for {caller} are open already; retry in 1 s",
                                headers={"Retry-After": "1"})
        self._open[key] += 1
        try:
            yield
        finally:
            self._open[key] -= 1
            if not self._open[key]:
                del self._open[key]


def open_request(request: Request, group: str, caller: int | str) -> AbstractAsyncContextManager[None]:
    """Holds one of `caller`'s open requests in `group` while the route serves (429 past the service's
    max_open_per_caller)."""
    return request.app.state.open_requests.hold(group, caller)


# JSON bodies larger than this are parsed on a worker thread: the loop keeps answering long-polls meanwhile.
_PARSE_ON_LOOP_BYTES = 64 * 2**10


async def read_json(request: Request, model: type[M], parse: Callable[[Any], M] | None = None) -> M:
    """A JSON body read by the route itself, after its dependencies (the token check) have run: FastAPI
    parses a declared body first, so a bad token with a malformed body answered 422, not 401. At most
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


class ErrorDetail(BaseModel):
    """Every error answer: a message, or (a 422 for invalid input) FastAPI's list of what is wrong where."""
    detail: str | list[dict[str, Any]]


_ERRORS = {
    400: "unreadable body (bad JSON or safetensors framing, bad Content-Length)",
    401: "missing or invalid bearer token",
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


# Only declares the bearer scheme in the OpenAPI document (auto_error=False: it refuses nothing); the token
# is checked by each router's guard, which knows which token it wants.
_bearer_doc = Depends(HTTPBearer(auto_error=False, scheme_name="bearer",
                                 description="the service's token for this API (see the README's REST table)"))


def guarded_router(guard: Any, **router_options: Any) -> APIRouter:
    """A router whose every route needs the bearer token that `guard` (a dependency) checks, documented so."""
    return APIRouter(dependencies=[_bearer_doc, guard], responses=error_responses(401), **router_options)


def binary_body_doc() -> dict[str, Any]:
    """OpenAPI for a route that reads a safetensors message with `read_message` (any content type is read
    as safetensors; clients send application/vnd.safetensors)."""
    octets = {"schema": {"type": "string", "format": "binary"}}
    return {"requestBody": {"required": True, "content": {SAFETENSORS: octets, "application/octet-stream": octets}}}


def json_body_doc(model: type[BaseModel]) -> dict[str, Any]:
    """OpenAPI for a route that reads its JSON body with `read_json`. The nested models are written in
    place: pydantic's `#/$defs/...` references would point at the root of the OpenAPI document, where
    there is no `$defs` (ReDoc refused the whole document: "Invalid reference token: $defs")."""
    schema = model.model_json_schema()
    defs = schema.pop("$defs", {})
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": _inline(schema, defs)}}}}


def _inline(schema: Any, defs: dict[str, Any]) -> Any:
    # The request models are not recursive, so writing each reference out ends.
    if isinstance(schema, dict):
        inlined = {k: _inline(v, defs) for k, v in schema.items() if k != "$ref"}
        if "$ref" in schema:  # keep what sits beside the reference (a field's description, default)
            return {**_inline(defs[schema["$ref"].removeprefix("#/$defs/")], defs), **inlined}
        return inlined
    if isinstance(schema, list):
        return [_inline(v, defs) for v in schema]
    return schema


def binary(blob: bytes, headers: dict[str, str] | None = None) -> Response:
    return Response(blob, media_type=SAFETENSORS, headers=headers)


def reject(exc: InvalidContent) -> HTTPException:
    return HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, str(exc))


class Stopping:
    """Set as soon as the process is told to stop (SIGTERM, Ctrl-C), before uvicorn waits for the open
    requests to finish. Long-polls watch it and answer 204 at once; otherwise each would hold the
    shutdown for up to its timeout (25 s by default, beyond docker's 10 s stop grace)."""

    def __init__(self) -> None:
        self._event = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None

    def bind(self) -> None:
        """Called on the serving loop (by `service_app`'s lifespan), which `set` hands the event to."""
        self._loop = asyncio.get_running_loop()

    def set(self) -> None:
        """Safe from a signal handler: the event is set on the serving loop, which this also wakes."""
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._event.set)

    def is_set(self) -> bool:
        return self._event.is_set()

    async def wait(self) -> None:
        await self._event.wait()


# Swagger UI, ReDoc (vendored with their licences, see its README.md) and the favicon, served at /static.
STATIC_DIR = Path(__file__).resolve().parent / "static"
STATIC = "/static"


def offline_docs(app: FastAPI) -> None:
    """/docs and /redoc with every asset served by the app itself. FastAPI's own pages load Swagger UI and
    ReDoc from a CDN, Google Fonts and a remote favicon, and Swagger UI's validator badge calls
    validator.swagger.io: none of which a machine without internet access can reach."""
    title, favicon = app.title, f"{STATIC}/favicon.svg"

    @app.get("/docs", include_in_schema=False)
    async def swagger_ui() -> HTMLResponse:
        return get_swagger_ui_html(openapi_url="/openapi.json", title=f"{title} - Swagger UI",
                                   swagger_js_url=f"{STATIC}/swagger-ui/swagger-ui-bundle.js",
                                   swagger_css_url=f"{STATIC}/swagger-ui/swagger-ui.css", swagger_favicon_url=favicon,
                                   swagger_ui_parameters={"validatorUrl": None})

    @app.get("/redoc", include_in_schema=False)
    async def redoc() -> HTMLResponse:
        return get_redoc_html(openapi_url="/openapi.json", title=f"{title} - ReDoc",
                              redoc_js_url=f"{STATIC}/redoc/redoc.standalone.js", redoc_favicon_url=favicon,
                              with_google_fonts=False)

    app.mount(STATIC, StaticFiles(directory=STATIC_DIR), name="static")


def service_app(title: str, lifespan, max_payload_bytes: int, routers: list[APIRouter],
                errors: dict[type[Exception], int], metrics: ServiceMetrics | None = None,
                metrics_token: str | None = None, server: ServerSettings | None = None) -> FastAPI:
    """A service's FastAPI app: bounded bodies (and `server`'s body deadline and rate limit, defaults
    without), its routers, its domain errors answered with their status
    and the message as `detail`, API docs that work offline, and `app.state.stopping` for its long-polls
    (see `serve`). With `metrics`: every request measured and `GET /metrics`, open unless `metrics_token`
    is set (then a bearer token)."""
    @asynccontextmanager
    async def bound(app: FastAPI):
        app.state.stopping.bind()  # on the loop that serves
        async with lifespan(app):
            yield

    # FastAPI's CDN-backed /docs and /redoc off: `offline_docs` serves them.
    app = FastAPI(title=title, version="0.1.0", lifespan=bound, docs_url=None, redoc_url=None)
    offline_docs(app)
    app.state.stopping = Stopping()
    server = server or ServerSettings()
    app.state.max_payload_bytes = max_payload_bytes  # what read_message reads at most
    app.state.rate_limit = RateLimit(server.rate_limit)
    app.state.open_requests = OpenRequests(server.max_open_per_caller)
    app.add_middleware(BodyLimit, limit=max_payload_bytes, timeout_s=server.body_timeout_s)
    for router in routers:
        app.include_router(router)
    if metrics is not None:
        app.state.metrics = metrics  # what the routes count through: the null object when switched off
    if isinstance(metrics, ServiceMetrics):  # not switched off (shared.metrics.switchable): measure and serve
        app.add_middleware(RequestMetrics, metrics=metrics)  # outermost: it sees BodyLimit's 413s too
        guard = [Depends(bearer_guard(lambda _: metrics_token))] if metrics_token is not None else []
        scrape = metrics_router(metrics, guard)
        app.include_router(scrape)
        metrics.know_routes([*routers, scrape])
    for error, status_code in errors.items():
        app.add_exception_handler(error, _answer_with(status_code))
    # Starlette's stub wants a handler of any Exception, though it calls this one with the class it is
    # registered for only.
    app.add_exception_handler(RequestValidationError, _invalid_request)  # type: ignore[arg-type]
    app.add_exception_handler(StarletteHTTPException, _http_error)  # type: ignore[arg-type]
    return app


# What a 4xx says back at most: this many of a 422's errors, this many characters of any text or input.
_MAX_ERRORS = 20
_MAX_ECHO = 200
_echo = reprlib.Repr()  # (its keyword arguments are Python 3.12's)
_echo.maxlevel, _echo.maxdict, _echo.maxlist, _echo.maxtuple, _echo.maxset = 2, 4, 4, 4, 4
_echo.maxstring = _echo.maxother = _MAX_ECHO


async def _invalid_request(_: Request, exc: RequestValidationError) -> JSONResponse:
    """FastAPI's 422, made small and safe to render. Its errors echo the input: a 60 MB body took a minute
    to be written back whole, so each error quotes at most a short excerpt, and only the first few errors
    are listed. An input such as 1e400 (inf) or a lone surrogate could not be written as JSON at all (the
    422 became a 500 and the connection was dropped)."""
    errors = list(exc.errors())
    shown = [{key: _brief(value) for key, value in error.items()} for error in errors[:_MAX_ERRORS]]
    if len(errors) > _MAX_ERRORS:
        shown.append({"type": "too_many_errors", "loc": [], "msg": f"{len(errors) - _MAX_ERRORS} more not shown"})
    return JSONResponse({"detail": _json_safe(jsonable_encoder(shown))},
                        status_code=status.HTTP_422_UNPROCESSABLE_CONTENT)


def _brief(value: Any) -> Any:
    """A value an error quotes back, cut short: scalars as they are (a long text truncated), a container
    as a short excerpt of its repr (reprlib looks at only the first few items)."""
    if isinstance(value, str):
        return value if len(value) <= _MAX_ECHO else value[:_MAX_ECHO] + f"… ({len(value)} characters)"
    if isinstance(value, (list, tuple)) and all(isinstance(v, (str, int)) for v in value[:_MAX_ERRORS]) \
            and len(value) <= _MAX_ERRORS:  # a location: its parts, each cut short
        return [_brief(v) for v in value]
    if isinstance(value, (dict, list, tuple, set, bytes)):
        return _echo.repr(value)
    return value


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


def _answer_with(status_code: int):
    async def handler(request: Request, exc: Exception) -> JSONResponse:
        reason = getattr(exc, "reason", None)  # a refusal's own name (e.g. "stale"), for the metrics
        if reason is not None:
            note_outcome(request, reason)
        return JSONResponse({"detail": _brief(str(exc))}, status_code=status_code)

    return handler


def serve(app: FastAPI, host: str, port: int, log_level: str, server: ServerSettings | None = None) -> None:
    """`uvicorn.run`, except that a stop signal sets `app.state.stopping` before the shutdown begins.
    `server`: its limits (connections, header deadline) and TLS options (`ServerSettings`).
    (Under a bare `uvicorn ... --factory` the long-polls run to their timeout: pass
    `--timeout-graceful-shutdown 1` there.)"""
    stopping: Stopping = app.state.stopping

    class Server(uvicorn.Server):
        def handle_exit(self, sig, frame) -> None:
            stopping.set()
            super().handle_exit(sig, frame)

    server = server or ServerSettings()
    _allow_open_files(server.max_connections + 256)  # each connection is a file; Redis, logs, data besides
    # log_config=None: uvicorn's loggers go through the process's one setup (shared.log), not their own.
    # The h11 protocol (uvicorn's pure-Python one; its request heads are capped at 16 KiB) with deadlines.
    # proxy_headers=False: uvicorn otherwise takes the caller's address from X-Forwarded-For whenever the
    # peer is 127.0.0.1, so any local caller wrote the address the audit log records; behind a proxy the
    # address is the proxy's, as the README says.
    Server(uvicorn.Config(app, host=host, port=port, log_level=log_level, log_config=None, proxy_headers=False,
                          http=h11_with_deadlines(server.header_timeout_s),
                          limit_concurrency=server.max_connections, **server.tls_options())).run()


def _allow_open_files(wanted: int) -> None:
    """Raises this process's soft limit of open files towards `wanted` (as far as the hard limit allows):
    the common default of 1,024 would refuse the 1,000 long-polling edges or clients a service must hold."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted if hard == resource.RLIM_INFINITY else min(wanted, hard),
                                                    hard))
