from __future__ import annotations

from fastapi import APIRouter

from fl_services.edge.deps import BoardDep, RoundLoopDep
from fl_services.shared.wire.admin import EdgeHealth

router = APIRouter(tags=["health"])


@router.get("/health")
async def health(board: BoardDep, loop: RoundLoopDep) -> EdgeHealth:
    current = loop.serving
    return EdgeHealth(edge_id=loop.edge_id, clients=len(board.clients),
                      run_id=current.run_id if current else None, version=current.version if current else None)
