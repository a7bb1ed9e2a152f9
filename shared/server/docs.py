"""API documentation that works offline: /docs and /redoc with vendored assets, and the OpenAPI of the
bodies routes read themselves."""
from __future__ import annotations

import base64
import hashlib
import re
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel
from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from fl_services.shared.wire.protocol import SAFETENSORS


def binary_body_doc(media_type: str = SAFETENSORS) -> dict[str, Any]:
    """OpenAPI for a route that reads a binary body: a safetensors message with `read_message` by default (any
    content type is read as safetensors; clients send application/vnd.safetensors), or `media_type` (a bundle)."""
    octets = {"schema": {"type": "string", "format": "binary"}}
    return {"requestBody": {"required": True, "content": {media_type: octets, "application/octet-stream": octets}}}


def binary_answer_doc(description: str, media_type: str = SAFETENSORS, **extra: Any) -> dict[int | str, Any]:
    """OpenAPI for a route's 200 answer that is binary (`binary`, a task bundle): declared with its own media type,
    where FastAPI would document JSON of any shape. The route says `response_class=Response` (no JSON default).
    `extra`: more of the answer's description (its headers)."""
    octets = {"schema": {"type": "string", "format": "binary"}}
    return {200: {"description": description, "content": {media_type: octets}, **extra}}


def json_body_doc(model: type[BaseModel]) -> dict[str, Any]:
    """OpenAPI for a route that reads its JSON body with `read_json`. The nested models are written in
    place: pydantic's `#/$defs/...` references would point at the root of the OpenAPI document, where
    there is no `$defs` (ReDoc refused the whole document: "Invalid reference token: $defs")."""
    schema = model.model_json_schema()
    defs = schema.pop("$defs", {})
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": _inline(schema, defs)}}}}


def _inline(schema: Any, defs: dict[str, Any]) -> Any:
    # The request models are not recursive, so writing each reference out ends.
    if isinstance(schema, dict):
        inlined = {k: _inline(v, defs) for k, v in schema.items() if k != "$ref"}
        if "$ref" in schema:  # keep what sits beside the reference (a field's description, default)
            return {**_inline(defs[schema["$ref"].removeprefix("#/$defs/")], defs), **inlined}
        return inlined
    if isinstance(schema, list):
        return [_inline(v, defs) for v in schema]
    return schema


# Swagger UI, ReDoc (vendored with their licences, see its README.md) and the favicon, served at /static.
STATIC_DIR = Path(__file__).resolve().parent / "static"


STATIC = "/static"

# The API docs pages run their vendored scripts and the one inline script that starts Swagger UI (allowed by its
# hash); both libraries add styles at run time (hence 'unsafe-inline' for styles, never for scripts), ReDoc draws
# with data: images and fonts and runs a worker from a blob. Nothing loads from elsewhere; nothing may frame them.
_DOCS_POLICY = ("default-src 'none'; script-src {scripts}; style-src 'self' 'unsafe-inline'; "
                "img-src 'self' data:; font-src 'self' data:; connect-src 'self'; worker-src 'self' blob:; "
                "base-uri 'none'; form-action 'self'; frame-ancestors 'none'")
FRAMING_HEADERS = {"X-Frame-Options": "DENY", "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer"}
_INLINE_SCRIPT = re.compile(r"<script>(.*?)</script>", re.DOTALL)


def _with_policy(page: HTMLResponse) -> HTMLResponse:
    """The page with its security headers: a policy allowing its own inline scripts by their sha256."""
    scripts = ["'self'", *(f"'sha256-{base64.b64encode(hashlib.sha256(script.encode()).digest()).decode()}'"
                           for script in _INLINE_SCRIPT.findall(bytes(page.body).decode()))]
    page.headers.update({"Content-Security-Policy": _DOCS_POLICY.format(scripts=" ".join(scripts)),
                         **FRAMING_HEADERS})
    return page


class PathHeaders:
    """Adds `headers` to every response under `prefix` (the path itself or below it): error pages and redirects
    as well as the files a mount serves."""

    def __init__(self, app: ASGIApp, prefix: str, headers: dict[str, str]):
        self.app, self.prefix, self.headers = app, prefix, headers

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or not (path == self.prefix or path.startswith(self.prefix + "/")):
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                MutableHeaders(scope=message).update(self.headers)
            await send(message)

        await self.app(scope, receive, with_headers)


def offline_docs(app: FastAPI) -> None:
    """/docs and /redoc with every asset served by the app itself. FastAPI's own pages load Swagger UI and
    ReDoc from a CDN, Google Fonts and a remote favicon, and Swagger UI's validator badge calls
    validator.swagger.io: none of which a machine without internet access can reach."""
    title, favicon = app.title, f"{STATIC}/favicon.svg"

    @app.get("/docs", include_in_schema=False)
    async def swagger_ui() -> HTMLResponse:
        return _with_policy(get_swagger_ui_html(openapi_url="/openapi.json", title=f"{title} - Swagger UI",
                                   swagger_js_url=f"{STATIC}/swagger-ui/swagger-ui-bundle.js",
                                   swagger_css_url=f"{STATIC}/swagger-ui/swagger-ui.css", swagger_favicon_url=favicon,
                                   swagger_ui_parameters={"validatorUrl": None}))

    @app.get("/redoc", include_in_schema=False)
    async def redoc() -> HTMLResponse:
        return _with_policy(get_redoc_html(openapi_url="/openapi.json", title=f"{title} - ReDoc",
                                           redoc_js_url=f"{STATIC}/redoc/redoc.standalone.js",
                                           redoc_favicon_url=favicon, with_google_fonts=False))

    app.mount(STATIC, StaticFiles(directory=STATIC_DIR), name="static")
