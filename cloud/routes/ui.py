"""The dashboard's pages, every asset served from cloud/ui/static (nothing from a CDN, so they work
offline; the API docs are shared/server/'s `offline_docs`, which link back here). The pages hold no data: they
read the admin API with the token the user enters."""
from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

from fastapi import APIRouter, FastAPI
from fastapi.responses import HTMLResponse, RedirectResponse
from fastapi.staticfiles import StaticFiles

from fl_services.cloud.ui.pages import PAGES, render
from fl_services.shared.server.app import add_routes
from fl_services.shared.server.docs import FRAMING_HEADERS, PathHeaders

STATIC = Path(__file__).resolve().parent.parent / "ui" / "static"
UI = "/ui"

# The pages run only their own files: scripts, styles and the API calls all from this origin, no inline code (the
# pages have none: a script injected into one would not run), never framed (clickjacking of the controls).
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
                               "connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'",
    **FRAMING_HEADERS,
}

DOCS_LINK = ("The cloud's dashboard: [runs](/ui/) and the [topology](/ui/topology.html) (sites and their devices), "
             "signed in with the admin token.")

router = APIRouter(include_in_schema=False)


@router.get("/")
async def root() -> RedirectResponse:
    return RedirectResponse(f"{UI}/")


def _page(html: str) -> Callable[[], Awaitable[HTMLResponse]]:
    async def page() -> HTMLResponse:
        return HTMLResponse(html)

    return page


def mount(app: FastAPI) -> None:
    """The pages (cloud/ui/pages.py: index.html at /ui/ too) and their static files, and the API docs' link to
    them. Every answer under /ui carries the security headers, its errors and redirects too (a 404 page is framed
    as easily as a page)."""
    app.description = DOCS_LINK
    pages = APIRouter(include_in_schema=False)
    for name in PAGES:
        page = _page(render(name))
        for path in (f"{UI}/{name}", f"{UI}/") if name == "index.html" else (f"{UI}/{name}",):
            pages.add_api_route(path, page, methods=["GET", "HEAD"])
    add_routes(app, pages)
    add_routes(app, router)
    app.mount(UI, StaticFiles(directory=STATIC, html=True), name="ui")
    app.add_middleware(PathHeaders, prefix=UI, headers=SECURITY_HEADERS)
