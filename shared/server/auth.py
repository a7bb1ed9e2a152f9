"""Bearer-token checks: a router whose every route needs a token, documented so in the OpenAPI."""
from __future__ import annotations

from collections.abc import Awaitable
from typing import Any, Callable

from fastapi import APIRouter, Depends, HTTPException, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from fl_services.shared.server.errors import error_responses
from fl_services.shared.wire.protocol import same_token

_bearer = HTTPBearer(auto_error=False)


def unauthorized(detail: str = "invalid bearer token") -> HTTPException:
    return HTTPException(status.HTTP_401_UNAUTHORIZED, detail, headers={"WWW-Authenticate": "Bearer"})


async def bearer_token(request: Request) -> str:
    """The request's bearer token, or 401."""
    creds: HTTPAuthorizationCredentials | None = await _bearer(request)
    if creds is None:
        raise unauthorized("missing bearer token")
    return creds.credentials


def bearer_guard(expected: Callable[[Request], str]) -> Callable[[Request], Awaitable[None]]:
    """A dependency that admits requests carrying `Authorization: Bearer <expected(request)>`."""

    async def guard(request: Request) -> None:
        if not same_token(await bearer_token(request), expected(request)):
            raise unauthorized()

    return guard


# Only declares the bearer scheme in the OpenAPI document (auto_error=False: it refuses nothing); the token
# is checked by each router's guard, which knows which token it wants.
_bearer_doc = Depends(HTTPBearer(auto_error=False, scheme_name="bearer",
                                 description="the service's token for this API (docs/explanation-security-model.md)"))


def guarded_router(guard: Any, **router_options: Any) -> APIRouter:
    """A router whose every route needs the bearer token that `guard` (a dependency) checks, documented so."""
    return APIRouter(dependencies=[_bearer_doc, guard], responses=error_responses(401), **router_options)
