"""Outbound HTTP for the edge (to the cloud) and the client (to the edge): timeouts, auth, retries.

Only outbound connections are made from edges and clients, so a device behind NAT can take part.
Retries (`shared/wire/retry.py`) re-send reads and deduplicated writes through transport errors
and 5xx answers (a restarting server) until they get through; 4xx answers are final.
"""
from __future__ import annotations

import ssl
import urllib.request
from functools import partial
from typing import Any

import httpx

from fl_services.shared.wire.protocol import SAFETENSORS
from fl_services.shared.wire.retry import RetryTransport, default_backoff
from fl_services.shared.wire.tls import client_context

# The default retry policy with each delay drawn from its upper half: the clients of one edge (and the
# edges of one cloud) that lost it together must not all come back in the same instant.
DEVICE_BACKOFF = partial(default_backoff, jitter=0.5)


def make_client(base_url: str, token: str, long_poll_s: float = 30.0,
                transport: httpx.AsyncBaseTransport | None = None, tls: ssl.SSLContext | None = None,
                **kwargs: Any) -> httpx.AsyncClient:
    """`tls`: how an https:// server is verified and what certificate is presented (`fl_services.shared.wire.tls.
    client_context`; None: the public CAs, no certificate). `transport` replaces the network under the
    retries (tests: an in-process server)."""
    # The read timeout must outlast the server's long-poll window.
    timeout = httpx.Timeout(connect=5.0, read=long_poll_s + 15.0, write=60.0, pool=None)
    # Given to the transport: a client's own `limits` apply only to the transport it would build itself.
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=200)
    return httpx.AsyncClient(
        base_url=base_url, headers={"Authorization": f"Bearer {token}"}, timeout=timeout,
        transport=RetryTransport(transport or httpx.AsyncHTTPTransport(verify=tls or client_context(), limits=limits,
                                                                       proxy=env_proxy(base_url)),
                                 backoff=DEVICE_BACKOFF),
        **kwargs
    )


def env_proxy(url: str) -> str | None:
    """The proxy the environment names for `url` (HTTP(S)_PROXY, ALL_PROXY, NO_PROXY), if any. httpx honours
    these only for the transports it builds itself, and ours wrap a transport in retries: a device behind
    a proxy would otherwise dial out directly and fail."""
    parsed = httpx.URL(url)
    if urllib.request.proxy_bypass(parsed.host):
        return None
    proxies = urllib.request.getproxies_environment()
    return proxies.get(parsed.scheme) or proxies.get("all")


def binary_body(blob: bytes, headers: dict[str, str] | None = None) -> dict[str, Any]:
    """httpx's arguments for a safetensors body, with `headers` besides (e.g. one client's Authorization)."""
    return {"content": blob, "headers": {"Content-Type": SAFETENSORS, **(headers or {})}}
