"""The app factory both services are built with: their routers' routes are put on each app as they are
(`add_routes`), not included, and the apps serve them as an inclusion would."""
from __future__ import annotations

from typing import Any

import pytest
from fastapi import APIRouter, FastAPI

from fl_services.cloud.app import create_app as cloud_app
from fl_services.cloud.config import CloudSettings
from fl_services.cloud.routes import ui
from fl_services.edge.app import create_app as edge_app
from fl_services.shared.server import app as server_app
from tests.cloud.harness import ADMIN_TOKEN, EDGE_TOKEN


def _included(app: FastAPI, router: APIRouter) -> None:
    app.include_router(router)


def build(service: str) -> FastAPI:
    if service == "cloud":
        return cloud_app(CloudSettings(admin_token=ADMIN_TOKEN, edge_token=EDGE_TOKEN, storage="memory"))
    return edge_app()


@pytest.mark.parametrize("service", ["cloud", "edge"])
def test_the_apps_document_every_operation_as_with_include_router(service, monkeypatch) -> None:
    """Paths, parameters, bodies, responses and each operation's security (a router's dependencies) are the
    same: a route keeps what its router gave it at its creation."""
    added: dict[str, Any] = build(service).openapi()
    monkeypatch.setattr(server_app, "add_routes", _included)
    monkeypatch.setattr(ui, "add_routes", _included)
    included = build(service).openapi()
    assert added == included
    assert len(added["paths"]) > 10


def test_the_routes_are_built_once_for_every_app() -> None:
    """Two apps share the route objects: nothing is rebuilt per app (or per first request to it)."""
    first, second = build("cloud"), build("cloud")
    assert {id(r) for r in first.routes if hasattr(r, "endpoint")} & {id(r) for r in second.routes
                                                                       if hasattr(r, "endpoint")}
