from __future__ import annotations

from fastapi import APIRouter

from cloud.deps import StoreDep
from shared.schemas import CloudHealth

router = APIRouter(tags=["health"])


@router.get("/health")
async def health(store: StoreDep) -> CloudHealth:
    await store.ping()  # unreachable Redis: an error, not "ok"
    return CloudHealth()
