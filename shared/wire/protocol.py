"""What both ends of a connection agree on, importable without a server (no FastAPI, no uvicorn): the
client and fedctl use it as they are, the cloud and the edge through shared/server/."""
from __future__ import annotations

import hashlib
import hmac
import json
import re
import secrets
from collections.abc import Mapping

# The media type of every body that is one safetensors document (shared/core/tensors.py).
SAFETENSORS = "application/vnd.safetensors"
# The media type of a task bundle: several task messages in one body (shared/wire/bundle.py).
TASK_BUNDLE = "application/vnd.fl.task-bundle"
# ... and of a result bundle: several logical clients' result messages in one upload (the same layout).
RESULT_BUNDLE = "application/vnd.fl.result-bundle"
# The header of a batch long-poll's answer (200 and 204) that lists the asked-for client ids the edge does not
# know (it restarted, or they are not its clients), comma-separated: the client process registers them again.
UNKNOWN_CLIENTS = "X-FL-Unknown-Clients"
# ... and those whose token the edge refuses (invalid, or revoked): the client process stops them.
REFUSED_CLIENTS = "X-FL-Refused-Clients"


def same_token(given: str, expected: str) -> bool:
    """Whether `given` is `expected`, in a time that does not say how much of it matched."""
    return hmac.compare_digest(given.encode(), expected.encode())


def client_token(secret: str, client_id: int) -> str:
    """Client `client_id`'s own token, derived from the edge's client secret: a device given it can act as
    that client only, where the secret itself would let it answer any client's tasks. The edge derives it
    to check a request; fedctl derives it to hand to a device."""
    return hmac.new(secret.encode(), f"fl-client:{client_id}".encode(), hashlib.sha256).hexdigest()

# The header of the cloud's long-poll answer (both 200 and 204) that lists the live runs (running or paused)
# the polling edge takes part in, comma-separated: the edge forgets the others and stops working on them.
LIVE_RUNS = "X-FL-Live-Runs"
# The header of the cloud's 409 to a contribution that declares devices another site holds in the run (a device is
# one member of the federation), as device:edge pairs comma-separated: the edge leaves them out and re-runs the round.
MEMBERS_ELSEWHERE = "X-FL-Members-Elsewhere"


_ELSEWHERE_SHOWN = 500  # a header stays small: beyond, the edge hears of the rest at its next submission


def members_elsewhere_text(holders: dict[int, int]) -> str:
    return ",".join(f"{k}:{e}" for k, e in sorted(holders.items())[:_ELSEWHERE_SHOWN])


def members_elsewhere(text: str) -> dict[int, int]:
    """The header's device -> edge pairs (ValueError if malformed)."""
    return {int(k): int(e) for k, _, e in (pair.partition(":") for pair in text.split(",") if pair)}


def live_runs(headers: Mapping[str, str]) -> set[str] | None:
    """The runs an answer's X-FL-Live-Runs names (an empty header: none), or None where it names none at all
    (the cloud and edges send it only once they know; an absent list must not read as "nothing is live")."""
    if LIVE_RUNS not in headers:
        return None
    return set(filter(None, headers[LIVE_RUNS].split(",")))

# A device token issued with an id (`fedctl issue-token`): "fl1.<client id>.<token id>.<mac>". The id is what
# an administrator revokes (POST /api/v1/tokens/revoked at the cloud), one device at a time: the edges refuse
# the ids the cloud lists. A derived token (client_token above) has the fixed id client-<k>.
DEVICE_TOKEN = "fl1"


# What a token id may be: what the cloud's revocation API accepts (shared/wire/, TokenId). A token whose
# id it refuses (e.g. "fl1.4..<mac>", an empty id) could never be revoked, so the edge does not admit it.
TOKEN_ID = re.compile(r"[A-Za-z0-9_-]{8,64}")


def derived_token_id(client_id: int) -> str:
    return f"client-{client_id}"


# A device token may name the one site (edge name) it may join: "<token>~<site>", its mac taken over the site too,
# so that a token stolen from a device serves at no other site. "~" is in no site name, token id or mac, and is a
# bearer token's character (RFC 6750).
SITE_SEPARATOR = "~"


def device_token(secret: str, client_id: int, token_id: str, site: str | None = None) -> str:
    # A token id holds no ":": the site's part of the mac's input cannot be read as another token's id.
    bound = "" if site is None else f":{site}"
    mac = hmac.new(secret.encode(), f"fl-device:{client_id}:{token_id}{bound}".encode(), hashlib.sha256).hexdigest()
    return f"{DEVICE_TOKEN}.{client_id}.{token_id}.{mac}" + ("" if site is None else f"{SITE_SEPARATOR}{site}")


def issue_device_tokens(secret: str, client_ids: list[int], site: str | None = None) -> dict[int, str]:
    """A new device token, each with a new random id, for every client in `client_ids` (`fedctl issue-token`;
    a client process holds them in its client_tokens setting), bound to `site` if given."""
    return {k: device_token(secret, k, secrets.token_hex(8), site) for k in client_ids}


def tokens_file_text(tokens: dict[int, str]) -> str:
    """What a client process's client_tokens file holds: JSON from client id to token, one per line."""
    return json.dumps({str(k): t for k, t in tokens.items()}, indent=1) + "\n"


def issued_token_parts(token: str) -> tuple[int, str] | None:
    """The client id and token id an issued device token names, or None for any other token. Read without the
    secret: the edge, which holds it, decides whether the token is genuine."""
    parts = token.partition(SITE_SEPARATOR)[0].split(".")
    if len(parts) != 4 or parts[0] != DEVICE_TOKEN or not parts[1].isdecimal():
        return None
    return int(parts[1]), parts[2]


def device_token_id(secret: str, token: str, client_id: int) -> str | None:
    """The id of `token` if it is client `client_id`'s own token (issued or derived), else None."""
    grant = device_token_grant(secret, token, client_id)
    return None if grant is None else grant[0]


def device_token_grant(secret: str, token: str, client_id: int) -> tuple[str, str | None] | None:
    """The id of `token` and the site it is bound to (None: any) if it is client `client_id`'s own token (issued or
    derived), else None."""
    if same_token(token, client_token(secret, client_id)):
        return derived_token_id(client_id), None
    issued, separator, site = token.partition(SITE_SEPARATOR)
    parts = issued.split(".")
    if len(parts) != 4 or parts[0] != DEVICE_TOKEN or parts[1] != str(client_id) or not TOKEN_ID.fullmatch(parts[2]):
        return None
    if separator and not site:
        return None
    expected = device_token(secret, client_id, parts[2], site if separator else None)
    return (parts[2], site if separator else None) if same_token(token, expected) else None
