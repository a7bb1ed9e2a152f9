"""A service's FastAPI app, built once for both servers: limits, routers, metrics, error handlers, docs."""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, Callable

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from fl_services.shared.server.auth import bearer_guard
from fl_services.shared.server.bodies import BodyLimit
from fl_services.shared.server.docs import offline_docs
from fl_services.shared.server.errors import _answer_with, _http_error, _invalid_request
from fl_services.shared.server.metrics import RequestMetrics, ServiceMetrics, metrics_router
from fl_services.shared.server.quotas import OpenRequests, RateLimit
from fl_services.shared.server.settings import ServerSettings


def add_routes(app: FastAPI, router: APIRouter) -> None:
    """The router's routes on the app itself, as `include_router` without options would serve them. An included
    router's routes are built again for each app that includes it (its dependencies resolved, a pydantic adapter
    per parameter and response), on the app's first request to them: a few milliseconds a route, paid by every
    app the tests build. A route carries its router's prefix, dependencies, responses and tags from its creation,
    and these routers are included with no options of their own, so the routes built once serve every app."""
    app.router.routes.extend(router.routes)


def app_state(name: str) -> Callable[[Request], Any]:
    """A dependency that returns `app.state.<name>`, what the service's lifespan put there."""

    def get(request: Request) -> Any:
        return getattr(request.app.state, name)

    return get


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


def service_app(title: str, lifespan: Callable[[FastAPI], AbstractAsyncContextManager[None]],
                max_payload_bytes: int, routers: list[APIRouter],
                errors: dict[type[Exception], int], metrics: ServiceMetrics | None = None,
                metrics_token: str | None = None, server: ServerSettings | None = None) -> FastAPI:
    """A service's FastAPI app: bounded bodies (and `server`'s body deadline and rate limit, defaults
    without), its routers, its domain errors answered with their status
    and the message as `detail`, API docs that work offline, and `app.state.stopping` for its long-polls
    (see `serve`). With `metrics`: every request measured and `GET /metrics`, open unless `metrics_token`
    is set (then a bearer token)."""
    @asynccontextmanager
    async def bound(app: FastAPI) -> AsyncIterator[None]:
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
        add_routes(app, router)
    if metrics is not None:
        app.state.metrics = metrics  # what the routes count through: the null object when switched off
    if isinstance(metrics, ServiceMetrics):  # not switched off (shared.server.metrics.switchable): measure and serve
        app.add_middleware(RequestMetrics, metrics=metrics)  # outermost: it sees BodyLimit's 413s too
        guard = [Depends(bearer_guard(lambda _: metrics_token))] if metrics_token is not None else []
        scrape = metrics_router(metrics, guard)
        add_routes(app, scrape)
        metrics.know_routes([*routers, scrape])
    for error, status_code in errors.items():
        app.add_exception_handler(error, _answer_with(status_code))
    # Starlette's stub wants a handler of any Exception, though it calls this one with the class it is
    # registered for only.
    app.add_exception_handler(RequestValidationError, _invalid_request)  # type: ignore[arg-type]
    app.add_exception_handler(StarletteHTTPException, _http_error)  # type: ignore[arg-type]
    return app
