"""FastAPI dependencies of the cloud: settings, store, orchestrator and the two bearer guards."""
from __future__ import annotations

from typing import Annotated

from fastapi import Depends

from cloud.config import CloudSettings
from cloud.orchestrator import Orchestrator
from cloud.store import Store
from shared.web import Stopping, app_state, bearer_guard

SettingsDep = Annotated[CloudSettings, Depends(app_state("settings"))]
StoreDep = Annotated[Store, Depends(app_state("store"))]
OrchestratorDep = Annotated[Orchestrator, Depends(app_state("orchestrator"))]
StoppingDep = Annotated[Stopping, Depends(app_state("stopping"))]

require_admin = Depends(bearer_guard(lambda r: r.app.state.settings.admin_token))
require_edge = Depends(bearer_guard(lambda r: r.app.state.settings.edge_token))
