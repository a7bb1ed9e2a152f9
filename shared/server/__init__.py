"""The toolkit both servers (cloud and edge) are built with: the app factory, bearer auth, bounded bodies,
per-caller quotas, error answers, offline API docs and serving. Imports wire and core, never a service.

The names below load on first use: a service's settings (server.settings) are read, and its --help answered,
without fastapi and torch."""
from __future__ import annotations

from typing import TYPE_CHECKING

from fl_services.shared.runtime.lazy import exports

_HOMES = {
    "Stopping": "app", "add_routes": "app", "app_state": "app", "service_app": "app",
    "bearer_guard": "auth", "bearer_token": "auth", "guarded_router": "auth",
    "unauthorized": "auth",
    "BodyLimit": "bodies", "binary": "bodies", "read_body": "bodies", "read_json": "bodies", "read_message": "bodies",
    "reject": "bodies", "same_as_url": "bodies",
    "binary_body_doc": "docs", "json_body_doc": "docs", "offline_docs": "docs",
    "ErrorDetail": "errors", "error_responses": "errors",
    "OpenRequests": "quotas", "RateLimit": "quotas", "open_request": "quotas", "rate_limited": "quotas",
    "serve": "serve", "ServerSettings": "settings",
}
__all__ = [
    "BodyLimit", "ErrorDetail", "OpenRequests", "RateLimit", "ServerSettings", "Stopping", "add_routes", "app_state",
    "bearer_guard", "bearer_token", "binary", "binary_body_doc", "error_responses", "guarded_router",
    "json_body_doc", "offline_docs", "open_request", "rate_limited", "read_body", "read_json", "read_message",
    "reject", "same_as_url", "serve", "service_app", "unauthorized",
]  # what _HOMES places

if TYPE_CHECKING:
    from fl_services.shared.server.app import Stopping, add_routes, app_state, service_app
    from fl_services.shared.server.auth import bearer_guard, bearer_token, guarded_router, unauthorized
    from fl_services.shared.server.bodies import (
        BodyLimit,
        binary,
        read_body,
        read_json,
        read_message,
        reject,
        same_as_url,
    )
    from fl_services.shared.server.docs import binary_body_doc, json_body_doc, offline_docs
    from fl_services.shared.server.errors import ErrorDetail, error_responses
    from fl_services.shared.server.quotas import OpenRequests, RateLimit, open_request, rate_limited
    from fl_services.shared.server.serve import serve
    from fl_services.shared.server.settings import ServerSettings


__getattr__ = exports(__name__, _HOMES)
