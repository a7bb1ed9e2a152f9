"""The dashboard's pages, every asset served from cloud/ui/static (nothing from a CDN, so they work
offline; the API docs are shared/server/'s `offline_docs`, which link back here). The pages hold no data: they
read the admin API with the token the user enters."""
from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, FastAPI
from fastapi.responses import RedirectResponse
from fastapi.staticfiles import StaticFiles
from starlette.responses import Response
from starlette.types import Scope

STATIC = Path(__file__).resolve().parent.parent / "ui" / "static"
UI = "/ui"

# The pages run only their own files: scripts, styles and the API calls all from this origin, no inline code (the
# pages have none: a script injected into one would not run), never framed (clickjacking of the controls).
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
                               "connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}

DOCS_LINK = ("The cloud's dashboard: [runs](/ui/) and the [topology](/ui/topology.html) (sites and their devices), "
             "signed in with the admin token.")

router = APIRouter(include_in_schema=False)


@router.get("/")
async def root() -> RedirectResponse:
    return RedirectResponse(f"{UI}/")


class Pages(StaticFiles):
    """The static files, each answered with the security headers."""

    async def get_response(self, path: str, scope: Scope) -> Response:
        response = await super().get_response(path, scope)
        response.headers.update(SECURITY_HEADERS)
        return response


def mount(app: FastAPI) -> None:
    """The pages and their static files (index.html at /ui/), and the API docs' link to them."""
    app.description = DOCS_LINK
    app.include_router(router)
    app.mount(UI, Pages(directory=STATIC, html=True), name="ui")
