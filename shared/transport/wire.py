"""What both ends of a connection agree on, importable without a server (no FastAPI, no uvicorn): the
client and fedctl use it as they are, the cloud and the edge through shared/web.py."""
from __future__ import annotations

import hashlib
import hmac

# The media type of every body that is one safetensors document (shared/transport/tensors.py).
SAFETENSORS = "application/vnd.safetensors"


def client_token(secret: str, client_id: int) -> str:
    """Client `client_id`'s own token, derived from the edge's client secret: a device given it can act as
    that client only, where the secret itself would let it answer any client's tasks. The edge derives it
    to check a request; fedctl derives it to hand to a device."""
    return hmac.new(secret.encode(), f"fl-client:{client_id}".encode(), hashlib.sha256).hexdigest()

# The header of the cloud's long-poll answer (both 200 and 204) that lists the live runs (running or paused)
# the polling edge takes part in, comma-separated: the edge forgets the others and stops working on them.
LIVE_RUNS = "X-FL-Live-Runs"
