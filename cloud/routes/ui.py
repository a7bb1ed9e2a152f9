"""The dashboard's pages and the API docs, every asset served from cloud/ui/static (nothing from a CDN,
so they work offline). The pages hold no data: they read the admin API with the token the user enters."""
from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, FastAPI
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse, RedirectResponse
from fastapi.staticfiles import StaticFiles

STATIC = Path(__file__).resolve().parent.parent / "ui" / "static"
UI = "/ui"
VENDOR = f"{UI}/vendor"
FAVICON = f"{UI}/favicon.svg"
# FastAPI's pages with its defaults (CDN scripts, Google Fonts, a remote favicon) turned off: the docs
# must render with no request to another host. Swagger UI's validator badge would call validator.swagger.io.
app_options = {"docs_url": None, "redoc_url": None}

router = APIRouter(include_in_schema=False)


@router.get("/")
async def root() -> RedirectResponse:
    return RedirectResponse(f"{UI}/")


@router.get("/docs")
async def swagger_ui() -> HTMLResponse:
    return get_swagger_ui_html(openapi_url="/openapi.json", title="FL cloud - Swagger UI",
                               swagger_js_url=f"{VENDOR}/swagger-ui/swagger-ui-bundle.js",
                               swagger_css_url=f"{VENDOR}/swagger-ui/swagger-ui.css", swagger_favicon_url=FAVICON,
                               swagger_ui_parameters={"validatorUrl": None})


@router.get("/redoc")
async def redoc() -> HTMLResponse:
    return get_redoc_html(openapi_url="/openapi.json", title="FL cloud - ReDoc",
                          redoc_js_url=f"{VENDOR}/redoc/redoc.standalone.js", redoc_favicon_url=FAVICON,
                          with_google_fonts=False)


def mount(app: FastAPI) -> None:
    """The pages, the docs and the static files (index.html at /ui/)."""
    app.include_router(router)
    app.mount(UI, StaticFiles(directory=STATIC, html=True), name="ui")
