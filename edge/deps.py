"""FastAPI dependencies of the edge."""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request

from edge.config import EdgeSettings
from edge.round_loop import EdgeRoundLoop
from edge.tasks import TaskBoard
from shared.schemas import ClientRegistration, TaskPoll
from shared.transport.wire import device_token_id
from shared.web import app_state, bearer_token, read_body, same_token, unauthorized

SettingsDep = Annotated[EdgeSettings, Depends(app_state("settings"))]
BoardDep = Annotated[TaskBoard, Depends(app_state("board"))]
RoundLoopDep = Annotated[EdgeRoundLoop, Depends(app_state("round_loop"))]


@dataclass(frozen=True)
class ClientAuth:
    """What the caller's token allows: every client (the edge's client secret, held by an operator's
    simulation worker) or one client (a device token: issued with an id by `fedctl issue-token`, or derived
    by `fedctl client-token`), unless the cloud lists that token's id as revoked."""

    token: str
    secret: str
    revoked: frozenset[str] = frozenset()

    def check(self, client_id: int | None) -> None:
        """401 unless the token may act as `client_id` (None: a malformed id, left to the route's 422)."""
        if same_token(self.token, self.secret):
            return
        token_id = None if client_id is None else device_token_id(self.secret, self.token, client_id)
        if token_id is None:
            raise unauthorized()
        if token_id in self.revoked:
            raise unauthorized(f"this device token ({token_id}) was revoked")


async def client_auth(request: Request) -> ClientAuth:
    """401 without a valid token, before anything else is looked at: the client a route names (in its
    path, or a registration's body) may use its own token."""
    state = request.app.state
    auth = ClientAuth(await bearer_token(request), state.settings.client_token, state.revocations.ids)
    if "client_id" in request.path_params:
        auth.check(_client_id(request.path_params["client_id"]))
    elif not same_token(auth.token, auth.secret):
        # A device registering, or polling for its tasks: its ids are in the body. At most the route's own
        # limit is read (413 beyond; the route then reads the same bytes).
        polling = request.url.path.endswith("/tasks")
        try:
            body = json.loads(await read_body(request, (TaskPoll if polling else ClientRegistration).max_body_bytes))
            claimed = body.get("client_ids") if polling else [body.get("client_id")]
        except (ValueError, AttributeError, RecursionError):  # not a JSON object: only the secret gets its 4xx
            claimed = None
        if not isinstance(claimed, list) or not claimed:
            claimed = [None]
        for k in claimed:  # a device token is one client's: a batch of several ids is refused
            auth.check(k if isinstance(k, int) and not isinstance(k, bool) else None)
    return auth


def _client_id(raw: str) -> int | None:
    # ASCII digits only: str.isdigit() admits '¹' and '①', which int() refuses.
    return int(raw) if raw.isascii() and raw.isdigit() and len(raw) <= 10 else None


