"""Outbound HTTP for the edge (to the cloud) and the client (to the edge): timeouts, auth, retries.

Only outbound connections are made from edges and clients, so a device behind NAT can take part.
Retries cover transport errors and 5xx answers (a restarting server); 4xx answers are final.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Any

import httpx

from shared.web import SAFETENSORS

log = logging.getLogger(__name__)


def make_client(base_url: str, token: str, long_poll_s: float = 30.0, **kwargs: Any) -> httpx.AsyncClient:
    # The read timeout must outlast the server's long-poll window.
    timeout = httpx.Timeout(connect=5.0, read=long_poll_s + 15.0, write=60.0, pool=None)
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=200)
    return httpx.AsyncClient(
        base_url=base_url, headers={"Authorization": f"Bearer {token}"}, timeout=timeout, limits=limits, **kwargs
    )


async def send(
    client: httpx.AsyncClient,
    method: str,
    url: str,
    *,
    attempts: int | None = None,
    backoff_s: float = 0.2,
    max_backoff_s: float = 5.0,
    **kwargs: Any,
) -> httpx.Response:
    """Sends until an answer below 500 arrives (or `attempts` run out; None means forever)."""
    delay, attempt = backoff_s, 0
    while True:
        attempt += 1
        try:
            response = await client.request(method, url, **kwargs)
            if response.status_code < 500:
                return response
            reason = f"HTTP {response.status_code}: {response.text[:200]}"
        except httpx.TransportError as exc:
            reason = repr(exc)
        if attempts is not None and attempt >= attempts:
            raise ConnectionError(f"{method} {url} failed after {attempt} attempts: {reason}")
        log.warning("%s %s failed (%s); retrying in %.1fs", method, url, reason, delay)
        await asyncio.sleep(delay)
        delay = min(delay * 2, max_backoff_s)


def binary_body(blob: bytes) -> dict[str, Any]:
    return {"content": blob, "headers": {"Content-Type": SAFETENSORS}}
