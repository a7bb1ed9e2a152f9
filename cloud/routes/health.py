from __future__ import annotations

from fastapi import APIRouter

from fl_services.cloud.deps import StoreDep
from fl_services.shared.wire.admin import CloudHealth

router = APIRouter(tags=["health"])


@router.get("/health")
async def health(store: StoreDep) -> CloudHealth:
    await store.ping()  # unreachable Redis: an error, not "ok"
    return CloudHealth()
