"""Prometheus metrics both servers share: a registry per app, request latency per route and status, and
the `/metrics` route.

One registry per app instance, not prometheus_client's global one, so that several apps built in one
process (the tests) count apart. Requests are labelled with the route's template
(`/api/v1/edges/{edge_id}/global`), never the raw path, so that ids do not multiply the series. Each
observation is a label lookup and an add under a lock: nothing here touches a tensor or a body.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar, cast

from fastapi import APIRouter, Request, Response, params
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from starlette.routing import BaseRoute, Match, Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger(__name__)
# Seconds. Long-polls answer at their timeout when nothing happens: the top buckets reach past it.
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0, 20.0)
# What a refusal is called when the code that refused it gave no finer reason (`note_outcome`).
REFUSAL_BY_STATUS = {400: "unreadable", 401: "unauthorized", 404: "not_found", 409: "conflict",
                     413: "too_large", 422: "invalid"}
UNMATCHED = "unmatched"
# The method label's values: a client chooses the method of its request, and any token is a valid HTTP
# method, so a label taken from the request as it came would add a series per made-up method.
_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "CONNECT", "TRACE"})
OTHER_METHOD = "other"
_OUTCOME = "fl_metrics_outcome"

Observer = Callable[[int, str | None, dict[str, str]], None]


def latency_buckets(long_poll_max_s: float) -> tuple[float, ...]:
    return tuple(sorted({*_LATENCY_BUCKETS, long_poll_max_s, 1.2 * long_poll_max_s}))


def note_outcome(request: Request, outcome: str) -> None:
    """Names the outcome of this request for the route's observer: e.g. "duplicate" for an accepted
    retry, or a refusal's reason finer than its status ("stale" rather than 409)."""
    setattr(request.state, _OUTCOME, outcome)


def refusal_reason(status: int, outcome: str | None) -> str:
    return outcome or REFUSAL_BY_STATUS.get(status, str(status))


class ServiceMetrics:
    """A service's registry and its request histogram; the cloud and the edge add their own metrics."""

    def __init__(self, long_poll_max_s: float = 25.0):
        self.registry = CollectorRegistry()
        self.requests = Histogram(
            "fl_http_request_duration_seconds", "HTTP requests by route template and status, with their latency",
            ["method", "route", "status"], buckets=latency_buckets(long_poll_max_s), registry=self.registry)
        self._observers: dict[tuple[str, str], Observer] = {}
        self._before_scrape: Callable[[], Awaitable[None]] | None = None
        self._routes: list[BaseRoute] = []

    def know_routes(self, routers: list[APIRouter]) -> None:
        """The routes to label a request with when it was answered before routing (BodyLimit's 413)."""
        self._routes = [route for router in routers for route in router.routes]

    def refusals(self, name: str, documentation: str, reasons: tuple[str, ...]) -> Counter:
        """A counter by refusal reason, each known reason present at 0 from the start (so that rate() sees
        the first refusal)."""
        counter = Counter(name, documentation, ["reason"], registry=self.registry)
        for reason in reasons:
            counter.labels(reason)
        return counter

    def observe_route(self, method: str, route: str, observer: Observer) -> None:
        """Calls `observer(status, outcome, path_params)` after every request to that route."""
        self._observers[(method, route)] = observer

    def before_scrape(self, refresh: Callable[[], Awaitable[None]]) -> None:
        """Runs `refresh` before each scrape (gauges read from the store); replaces an earlier one."""
        self._before_scrape = refresh

    def observe(self, scope: Scope, status: int, seconds: float) -> None:
        method = scope["method"] if scope["method"] in _METHODS else OTHER_METHOD
        route = self._route_template(scope)
        self.requests.labels(method, route, str(status)).observe(seconds)
        observer = self._observers.get((method, route))
        if observer is not None:
            observer(status, scope.get("state", {}).get(_OUTCOME), scope.get("path_params", {}))

    async def scrape(self) -> bytes:
        if self._before_scrape is not None:
            try:
                await self._before_scrape()
            except Exception:  # e.g. Redis away: the scrape still reports every counter (and the last gauges)
                log.warning("metrics: reading the gauges failed", exc_info=True)
        return generate_latest(self.registry)


    def _route_template(self, scope: Scope) -> str:
        route = scope.get("route")
        if route is not None:
            return str(route.path)
        # Answered before routing: match the routes here, as the router would have.
        for candidate in self._routes:
            match, _ = candidate.matches(scope)
            if match == Match.FULL and isinstance(candidate, Route):
                return candidate.path
        return UNMATCHED


class RequestMetrics:
    """ASGI middleware: every HTTP request's latency, labelled by method, route template and status."""

    def __init__(self, app: ASGIApp, metrics: ServiceMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started, status = time.perf_counter(), 500

        async def recording_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, recording_send)
        finally:
            self.metrics.observe(scope, status, time.perf_counter() - started)


class _Off:
    """Metrics switched off: a null object standing for a service's metrics. Every attribute and every call
    gives this object again, so `metrics.submissions.labels("202").inc()` or `metrics.trained(header)` does
    nothing, and the code that counts (orchestrator, round loop, routes) needs no check of its own."""

    def __getattr__(self, _name: str) -> _Off:
        return self

    def __call__(self, *_args: object, **_kwargs: object) -> _Off:
        return self


MetricsT = TypeVar("MetricsT", bound=ServiceMetrics)


def switchable(enabled: bool, make: Callable[[], MetricsT]) -> MetricsT:
    """`make()`, or with metrics off (`FL_*_METRICS=false`) the null object in its place: nothing is
    counted, and `service_app` adds neither the middleware nor `GET /metrics` (404) for it."""
    return make() if enabled else cast(MetricsT, _Off())


def metrics_router(metrics: ServiceMetrics, dependencies: Sequence[params.Depends]) -> APIRouter:
    """`GET /metrics` in Prometheus's text format, behind `dependencies` (a token guard, or none)."""
    router = APIRouter(tags=["metrics"], dependencies=dependencies)

    @router.get("/metrics", response_class=Response)
    async def scrape() -> Response:
        return Response(await metrics.scrape(), media_type=CONTENT_TYPE_LATEST)

    return router
