from __future__ import annotations

from fastapi import APIRouter

from fl_services.edge.deps import BoardDep, RoundLoopDep
from fl_services.shared.wire.admin import EdgeHealth

router = APIRouter(tags=["health"])


@router.get("/health")
async def health(board: BoardDep, loop: RoundLoopDep) -> EdgeHealth:
    current = loop.current
    if current is not None and current.run_id not in loop.lanes:
        # A run the edge no longer serves: it was named until the next one started when the state long-poll's
        # X-FL-Live-Runs, not the end long-poll, dropped its round (test_resilience's stop test, 1 run in 8).
        current = None
    return EdgeHealth(edge_id=loop.edge_id, clients=len(board.clients),
                      run_id=current.run_id if current else None, version=current.version if current else None)
