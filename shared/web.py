"""HTTP pieces both servers (cloud and edge) use: bearer auth, bounded body reads, binary replies, API docs
served offline, and serving with long-polls that end as soon as the process is told to stop. Server side
only: what the client and fedctl share with the servers is in shared/transport/wire.py."""
from __future__ import annotations

import asyncio
import json
import math
import secrets
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Callable

import uvicorn
from fastapi import APIRouter, Depends, FastAPI, HTTPException, Request, status
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse, JSONResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel, ValidationError
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from shared.metrics import RequestMetrics, ServiceMetrics, metrics_router, note_outcome
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
    def __init__(self, limit: int):
        super().__init__(status.HTTP_413_CONTENT_TOO_LARGE, f"payload exceeds the limit of {limit} bytes")


class BodyLimit:
    """ASGI middleware: any request body over `limit` bytes gets 413 before it is all in memory.

    It checks the declared Content-Length first and then counts what actually arrives, so a chunked
    or lying upload is cut off as well; JSON and binary routes are covered alike.
    """

    def __init__(self, app: ASGIApp, limit: int):
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and not declared.isdigit():
            return await _answer(scope, receive, send, 400, "invalid Content-Length")
        if declared is not None and int(declared) > self.limit:
            return await _answer(scope, receive, send, 413,
                                 f"payload of {int(declared)} bytes exceeds the limit of {self.limit}")
        received, started = 0, False

        async def counting_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.limit:
                    raise _TooLarge(self.limit)
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counting_receive, tracking_send)
        except _TooLarge as exc:  # raised where no exception handler runs (e.g. in another middleware)
            if not started:
                await _answer(scope, receive, send, exc.status_code, exc.detail)


async def _answer(scope: Scope, receive: Receive, send: Send, code: int, detail: str) -> None:
    await JSONResponse({"detail": detail}, status_code=code)(scope, receive, send)


async def read_message(request: Request, message_type: type[M]) -> tuple[Record, M, bytes]:
    """A binary message from the body: 400 if unreadable, 422 if the header is invalid (413: BodyLimit).
    Decoding copies every tensor: on a worker thread, so the loop keeps answering long-polls meanwhile."""
    blob = await request.body()
    try:
        tensors, header = await asyncio.to_thread(decode, blob, message_type)
    except InvalidContent as exc:
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, str(exc)) from exc
    except PayloadError as exc:
        raise HTTPException(status.HTTP_400_BAD_REQUEST, str(exc)) from exc
    return tensors, header, blob


async def read_json(request: Request, model: type[M], parse: Callable[[Any], M] | None = None) -> M:
    """A JSON body read by the route itself, after its dependencies (the token check) have run: FastAPI
    parses a declared body first, so a bad token with a malformed body answered 422, not 401. `parse`
    replaces `model.model_validate` where a model needs checks it cannot make itself (a RunConfig's
    algorithm); its ValidationError is a 422 all the same."""
    body = await request.body()
    try:
        data = json.loads(body)
    except RecursionError as exc:
        raise HTTPException(status.HTTP_400_BAD_REQUEST, "JSON body nested too deeply") from exc
    except ValueError as exc:  # as FastAPI words it for a declared body
        error = exc.msg if isinstance(exc, json.JSONDecodeError) else str(exc)
        raise RequestValidationError([{"type": "json_invalid", "loc": ("body", getattr(exc, "pos", 0)),
                                       "msg": "JSON decode error", "input": {}, "ctx": {"error": error}}]) from exc
    try:
        return (parse or model.model_validate)(data)
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
    413: "body over the service's max_payload_bytes",
    422: "invalid input: the body, header or parameters fail validation",
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
                metrics_token: str | None = None) -> FastAPI:
    """A service's FastAPI app: bounded bodies, its routers, its domain errors answered with their status
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
    app.add_middleware(BodyLimit, limit=max_payload_bytes)
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
    return app


async def _invalid_request(_: Request, exc: RequestValidationError) -> JSONResponse:
    """FastAPI's 422, made safe to render: its errors echo the input, and an input such as 1e400 (inf) or a
    lone surrogate could not be written as JSON, so the 422 became a 500 and the connection was dropped."""
    return JSONResponse({"detail": _json_safe(jsonable_encoder(exc.errors()))},
                        status_code=status.HTTP_422_UNPROCESSABLE_CONTENT)


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
        return JSONResponse({"detail": str(exc)}, status_code=status_code)

    return handler


def serve(app: FastAPI, host: str, port: int, log_level: str, tls: dict[str, Any] | None = None) -> None:
    """`uvicorn.run`, except that a stop signal sets `app.state.stopping` before the shutdown begins.
    `tls`: uvicorn's TLS options (`ServerSettings.tls_options`), for HTTPS.
    (Under a bare `uvicorn ... --factory` the long-polls run to their timeout: pass
    `--timeout-graceful-shutdown 1` there.)"""
    stopping: Stopping = app.state.stopping

    class Server(uvicorn.Server):
        def handle_exit(self, sig, frame) -> None:
            stopping.set()
            super().handle_exit(sig, frame)

    # log_config=None: uvicorn's loggers go through the process's one setup (shared.log), not their own.
    Server(uvicorn.Config(app, host=host, port=port, log_level=log_level, log_config=None, **(tls or {}))).run()
