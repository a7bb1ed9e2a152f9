"""FastAPI dependencies of the cloud: settings, store, orchestrator and the two bearer guards."""
from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from fl_services.cloud.audit import Auditor
from fl_services.cloud.config import CloudSettings
from fl_services.cloud.orchestrator import Orchestrator
from fl_services.cloud.storage import Store
from fl_services.shared.server.app import Stopping, app_state
from fl_services.shared.server.auth import bearer_guard, bearer_token, unauthorized

SettingsDep = Annotated[CloudSettings, Depends(app_state("settings"))]
StoreDep = Annotated[Store, Depends(app_state("store"))]
OrchestratorDep = Annotated[Orchestrator, Depends(app_state("orchestrator"))]
StoppingDep = Annotated[Stopping, Depends(app_state("stopping"))]



async def admin_name(request: Request) -> str:
    """The name of the admin token the request carries ("admin", or one of admin_tokens), or 401."""
    name = request.app.state.settings.admin_name(await bearer_token(request))
    if name is None:
        raise unauthorized()
    return name


async def auditor(request: Request, actor: Annotated[str, Depends(admin_name)]) -> Auditor:
    """Records the request's admin actions under the caller's name and address."""
    state = request.app.state
    return Auditor(state.store, actor, state.settings.audit_max_entries,
                   request.client.host if request.client else None)


AuditDep = Annotated[Auditor, Depends(auditor)]
require_admin = Depends(admin_name)
require_edge = Depends(bearer_guard(lambda r: r.app.state.settings.edge_token))
