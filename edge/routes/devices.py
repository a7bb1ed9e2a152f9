"""Operator-facing API of the edge: its device registry."""
from __future__ import annotations

from fastapi import Depends

from fl_services.edge.deps import BoardDep, operator_auth
from fl_services.edge.services import devices
from fl_services.shared.server.auth import guarded_router
from fl_services.shared.server.errors import error_responses
from fl_services.shared.wire.admin import DeviceInfo

router = guarded_router(Depends(operator_auth), prefix="/api/v1", tags=["devices"])


@router.get("/devices", responses=error_responses(403))
async def list_devices(board: BoardDep) -> list[DeviceInfo]:
    """Every device registered at this edge: its labels, data summary, state and when it was last heard from. For
    the holder of the edge's client secret (an operator); a device's own token is answered 403."""
    return devices.list_devices(board=board)
