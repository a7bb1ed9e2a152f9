"""FastAPI dependencies of the edge."""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from fastapi import Depends, HTTPException, Request, status
from prometheus_client import Counter

from fl_services.edge.config import EdgeSettings
from fl_services.edge.metrics import EdgeMetrics
from fl_services.edge.round_loop import EdgeRoundLoop
from fl_services.edge.tasks import TaskBoard
from fl_services.shared.server.app import app_state
from fl_services.shared.server.auth import bearer_token, unauthorized
from fl_services.shared.server.bodies import read_body
from fl_services.shared.wire.client_edge import ClientRegistration, TaskPoll
from fl_services.shared.wire.protocol import device_token_grant, issued_token_parts, same_token

SettingsDep = Annotated[EdgeSettings, Depends(app_state("settings"))]
BoardDep = Annotated[TaskBoard, Depends(app_state("board"))]
RoundLoopDep = Annotated[EdgeRoundLoop, Depends(app_state("round_loop"))]
MetricsDep = Annotated[EdgeMetrics, Depends(app_state("metrics"))]


@dataclass(frozen=True)
class Refusal:
    """Why a token may not act as a client: `reason` is the metric's label (fl_edge_device_tokens_refused)."""

    reason: Literal["invalid", "revoked", "other_site"]
    detail: str

    def error(self) -> HTTPException:
        """401 for a token that is not the client's (or revoked); 403 for the client's own, bound to another site:
        genuine, but not to be used here."""
        if self.reason == "other_site":
            return HTTPException(status.HTTP_403_FORBIDDEN, self.detail)
        return unauthorized(self.detail)


INVALID = Refusal("invalid", "invalid bearer token")


@dataclass(frozen=True)
class ClientAuth:
    """What the caller's token allows: every client (the edge's client secret, held by an operator's
    simulation worker) or one client (a device token: issued with an id by `fedctl issue-token`, or derived
    by `fedctl client-token`), unless the cloud lists that token's id as revoked, or the token is bound to a site
    other than this edge's (`fedctl issue-token --site`)."""

    token: str
    secret: str
    revoked: frozenset[str] = frozenset()
    site: str | None = None  # this edge's site name; None: site-bound tokens are taken anywhere
    refusals: Counter | None = None  # counts each refusal by reason

    def check(self, client_id: int | None) -> None:
        """401 unless the token may act as `client_id` (None: a malformed id, left to the route's 422); 403 for the
        client's token bound to another site."""
        refusal = self.refusal(client_id)
        if refusal is not None:
            raise self.refuse(refusal)

    def refuse(self, refusal: Refusal) -> HTTPException:
        """The refusal, counted, as the error to raise."""
        self.count(refusal)
        return refusal.error()

    def count(self, refusal: Refusal) -> None:
        if self.refusals is not None:
            self.refusals.labels(refusal.reason).inc()

    def refusal(self, client_id: int | None, token: str | None = None) -> Refusal | None:
        """Why `token` (default: the bearer token) may not act as `client_id`, or None if it may."""
        token = self.token if token is None else token
        if same_token(token, self.secret):
            return None
        grant = None if client_id is None else device_token_grant(self.secret, token, client_id)
        if grant is None:
            own = self.issued_own(token)
            if own is not None and client_id is not None:  # genuine, and its id is in it: no secret is told
                return Refusal("invalid", f"this device token acts for client {own} only, not client {client_id}")
            return INVALID
        token_id, site = grant
        if token_id in self.revoked:
            return Refusal("revoked", f"this device token ({token_id}) was revoked")
        if site is not None and self.site is not None and site != self.site:
            return Refusal("other_site", f"this device token ({token_id}) may join site {site!r} only; this edge is "
                                         f"site {self.site!r}")
        return None

    def issued_own(self, token: str | None = None) -> int | None:
        """The client an issued device token (default: the bearer token) names, if it is genuinely that client's
        (revoked or not, bound to any site); None for any other token."""
        token = self.token if token is None else token
        issued = issued_token_parts(token)
        return issued[0] if issued is not None and device_token_grant(self.secret, token, issued[0]) else None

    def genuine(self, client_ids: list[int | None]) -> bool:
        """Whether the bearer token itself is a credential: the secret, or a token of one of `client_ids` (issued
        or derived, revoked or not: which of them may be served is each one's refusal). A batch poll's inner
        tokens do not stand in for it."""
        return same_token(self.token, self.secret) or any(
            k is not None and device_token_grant(self.secret, self.token, k) is not None for k in client_ids)

    def token_id(self, client_id: int) -> str | None:
        """The id of the device token acting as `client_id` (None: the edge's client secret, or no such token)."""
        grant = None if same_token(self.token, self.secret) else device_token_grant(self.secret, self.token, client_id)
        return None if grant is None else grant[0]

    def refused(self, poll: TaskPoll) -> list[int]:
        """The polled clients this token (or the poll's own token of each) may not act as, each refusal counted;
        401 (403: every one's token bound to another site) if it may act as none of them."""
        refused = {k: reason for k in poll.client_ids if (reason := self.refusal(k, poll.tokens.get(k))) is not None}
        if len(refused) == len(poll.client_ids):
            raise self.refuse(next(iter(refused.values())))
        for refusal in refused.values():
            self.count(refusal)
        return list(refused)


async def client_auth(request: Request) -> ClientAuth:
    """401 without a valid token, before anything else is looked at: the client a route names (in its
    path, or a registration's body) may use its own token."""
    state = request.app.state
    auth = ClientAuth(await bearer_token(request), state.settings.client_token, state.revocations.ids,
                      state.settings.site_name, state.metrics.device_tokens_refused)
    if "client_id" in request.path_params:
        auth.check(_client_id(request.path_params["client_id"]))
    elif request.url.path.endswith("/results") and not same_token(auth.token, auth.secret):
        # A result bundle answers many clients' tasks: the secret's to send, as a device token acts as its one client.
        raise auth.refuse(Refusal("invalid", "a result bundle is sent with the edge's client secret; a device "
                                             "token sends its client's result to /api/v1/clients/{client_id}/results"))
    elif not same_token(auth.token, auth.secret):
        # A device registering, or a process polling for its clients' tasks: the ids (and, polling, each one's
        # own token) are in the body. At most the route's own limit is read (413 beyond; the route then reads
        # the same bytes). A poll passes if any of its clients may be served: the route leaves out the others.
        polling = request.url.path.endswith("/tasks")
        claimed: list[Any] = [None]
        tokens: dict[str, Any] = {}
        try:
            body = json.loads(await read_body(request, (TaskPoll if polling else ClientRegistration).max_body_bytes))
            claimed = list(body.get("client_ids") or [None]) if polling else [body.get("client_id")]
            tokens = dict(body.get("tokens") or {}) if polling else {}
        except HTTPException as exc:
            # A body over the limit names no client: only a token that names its own (an issued device token)
            # is known genuine, and gets the 413; any other is refused as a token first.
            issued = issued_token_parts(auth.token)
            if exc.status_code != status.HTTP_413_CONTENT_TOO_LARGE or issued is None or not auth.genuine([issued[0]]):
                raise auth.refuse(INVALID) from exc
            raise
        except (ValueError, TypeError, AttributeError, RecursionError):  # malformed: only the secret gets its 4xx
            pass
        ids = [k if isinstance(k, int) and not isinstance(k, bool) else None for k in claimed]
        if all(k is None for k in ids) and (own := auth.issued_own()) is not None:
            # The body names no client, but the token names its own and is genuine: the route's 422 says what is
            # wrong with the body, where "invalid bearer token" would send its holder after the wrong thing.
            if (refusal := auth.refusal(own)) is not None:
                raise auth.refuse(refusal)
            return auth
        if not auth.genuine(ids):
            raise auth.refuse(auth.refusal(next((k for k in ids if k is not None), None)) or INVALID)
        reasons = [auth.refusal(k, t if isinstance(t := tokens.get(str(k)), str) else None) for k in ids]
        if None not in reasons:
            raise auth.refuse(reasons[0] or INVALID)
    return auth


async def operator_auth(request: Request) -> None:
    """Passes the edge's client secret (an operator's) only. A device token a device may use here (issued or
    derived, of a device registered here; not revoked) is a credential without this right: 403, saying why; any
    other token, 401."""
    state = request.app.state
    auth = ClientAuth(await bearer_token(request), state.settings.client_token, state.revocations.ids)
    if same_token(auth.token, auth.secret):
        return
    issued = issued_token_parts(auth.token)
    # An issued token names its device; a derived one does not, so it is tried against the devices registered here.
    candidates = [issued[0]] if issued is not None else list(state.board.clients)
    device = next((k for k in candidates if auth.refusal(k) is None), None)
    if device is None:
        raise unauthorized("invalid bearer token")
    raise HTTPException(status.HTTP_403_FORBIDDEN, f"a device token (client {device}'s) acts for its device only; "
                        "the device registry is the operator's: present the edge's client secret")


def _client_id(raw: str) -> int | None:
    # ASCII digits only: str.isdigit() admits '¹' and '①', which int() refuses.
    return int(raw) if raw.isascii() and raw.isdigit() and len(raw) <= 10 else None


ClientAuthDep = Annotated[ClientAuth, Depends(client_auth)]
