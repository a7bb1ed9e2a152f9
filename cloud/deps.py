"""FastAPI dependencies of the cloud: settings, store, orchestrator and the two bearer guards."""
from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from cloud.config import CloudSettings
from cloud.orchestrator import Orchestrator
from cloud.store import Store
from shared.web import Stopping, bearer_guard


def _settings(request: Request) -> CloudSettings:
    return request.app.state.settings


def _store(request: Request) -> Store:
    return request.app.state.store


def _orchestrator(request: Request) -> Orchestrator:
    return request.app.state.orchestrator


def _stopping(request: Request) -> Stopping:
    return request.app.state.stopping


SettingsDep = Annotated[CloudSettings, Depends(_settings)]
StoreDep = Annotated[Store, Depends(_store)]
OrchestratorDep = Annotated[Orchestrator, Depends(_orchestrator)]
StoppingDep = Annotated[Stopping, Depends(_stopping)]

require_admin = Depends(bearer_guard(lambda r: r.app.state.settings.admin_token))
require_edge = Depends(bearer_guard(lambda r: r.app.state.settings.edge_token))
