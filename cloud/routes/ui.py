"""The dashboard's pages, every asset served from cloud/ui/static (nothing from a CDN, so they work
offline; the API docs are shared/server/'s `offline_docs`). The pages hold no data: they read the admin API
with the token the user enters."""
from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, FastAPI
from fastapi.responses import RedirectResponse
from fastapi.staticfiles import StaticFiles

STATIC = Path(__file__).resolve().parent.parent / "ui" / "static"
UI = "/ui"

router = APIRouter(include_in_schema=False)


@router.get("/")
async def root() -> RedirectResponse:
    return RedirectResponse(f"{UI}/")


def mount(app: FastAPI) -> None:
    """The pages and their static files (index.html at /ui/)."""
    app.include_router(router)
    app.mount(UI, StaticFiles(directory=STATIC, html=True), name="ui")
