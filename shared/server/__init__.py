"""The toolkit both servers (cloud and edge) are built with: the app factory, bearer auth, bounded bodies,
per-caller quotas, error answers, offline API docs and serving. Imports wire and core, never a service."""
from __future__ import annotations

from fl_services.shared.server.app import Stopping, app_state, service_app
from fl_services.shared.server.auth import bearer_guard, bearer_token, guarded_router, same_token, unauthorized
from fl_services.shared.server.bodies import BodyLimit, binary, read_body, read_json, read_message, reject, same_as_url
from fl_services.shared.server.docs import binary_body_doc, json_body_doc, offline_docs
from fl_services.shared.server.errors import ErrorDetail, error_responses
from fl_services.shared.server.quotas import OpenRequests, RateLimit, open_request, rate_limited
from fl_services.shared.server.serve import serve
from fl_services.shared.server.settings import ServerSettings

__all__ = [
    "BodyLimit", "ErrorDetail", "OpenRequests", "RateLimit", "ServerSettings", "Stopping", "app_state",
    "bearer_guard", "bearer_token", "binary", "binary_body_doc", "error_responses", "guarded_router",
    "json_body_doc", "offline_docs", "open_request", "rate_limited", "read_body", "read_json", "read_message",
    "reject", "same_as_url", "same_token", "serve", "service_app", "unauthorized",
]
