"""FastAPI dependencies of the edge."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, HTTPException, Request, status

from edge.config import EdgeSettings
from edge.round_loop import EdgeRoundLoop
from edge.tasks import TaskBoard
from shared.web import bearer_token, client_token, same_token


def _settings(request: Request) -> EdgeSettings:
    return request.app.state.settings


def _board(request: Request) -> TaskBoard:
    return request.app.state.board


def _loop(request: Request) -> EdgeRoundLoop:
    return request.app.state.round_loop


SettingsDep = Annotated[EdgeSettings, Depends(_settings)]
BoardDep = Annotated[TaskBoard, Depends(_board)]
RoundLoopDep = Annotated[EdgeRoundLoop, Depends(_loop)]

@dataclass(frozen=True)
class ClientAuth:
    """What the caller's token allows: every client (the edge's client secret, held by an operator's
    simulation worker) or one client (`client_token(secret, k)`, what a device is given)."""

    token: str
    secret: str

    def check(self, client_id: int | None) -> None:
        """401 unless the token may act as `client_id` (None: a malformed id, left to the route's 422)."""
        if same_token(self.token, self.secret):
            return
        if client_id is None or not same_token(self.token, client_token(self.secret, client_id)):
            raise HTTPException(status.HTTP_401_UNAUTHORIZED, "invalid bearer token",
                                headers={"WWW-Authenticate": "Bearer"})


async def client_auth(request: Request) -> ClientAuth:
    """401 without a valid token; a route that names a client in its path admits that client's token."""
    auth = ClientAuth(await bearer_token(request), request.app.state.settings.client_token)
    raw = request.path_params.get("client_id")
    if raw is not None:
        auth.check(int(raw) if raw.isdigit() else None)
    return auth


ClientAuthDep = Annotated[ClientAuth, Depends(client_auth)]
