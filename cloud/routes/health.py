from __future__ import annotations

from fastapi import APIRouter

from cloud.deps import StoreDep

router = APIRouter(tags=["health"])


@router.get("/health")
async def health(store: StoreDep) -> dict[str, str]:
    await store.r.ping()
    return {"status": "ok", "service": "cloud"}
