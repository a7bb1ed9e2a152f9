"""TLS for every HTTP hop, in one place: the ssl context a client (edge, client process, fedctl) verifies its
server with and presents its certificate from, and the options a server (cloud, edge) serves HTTPS with.

A client given no CA bundle trusts the public CAs (certifi's, as httpx does by default); a deployment with its
own CA (`fedctl certs`) names its ca.pem. A server given a client CA bundle requires every client to present a
certificate that CA signed and that is valid now (mutual TLS); the TLS handshake refuses any other before a
single byte of HTTP is read.
"""
from __future__ import annotations

import functools
import ssl
from pathlib import Path
from typing import Any

import httpx


def client_context(ca_file: Path | None = None, cert_file: Path | None = None,
                   key_file: Path | None = None) -> ssl.SSLContext:
    """Verifies the server's certificate chain and host name against `ca_file` (else the public CAs) and,
    with `cert_file` (and `key_file`, unless the key is in the same PEM), presents that certificate."""
    if ca_file is None and cert_file is None:
        return _public_cas()
    context = ssl.create_default_context(cafile=str(ca_file)) if ca_file else httpx.create_ssl_context()
    if cert_file is not None:
        context.load_cert_chain(cert_file, key_file)
    return context


@functools.cache
def _public_cas() -> ssl.SSLContext:
    """The public CAs' context, built once per process and shared: loading the bundle takes ~30 ms of CPU, and
    each edge lifespan, health poll and fedctl call wanted one. Nothing changes it afterwards (a certificate to
    present gets a context of its own above); httpcore only sets the same ALPN protocols on it at every connect
    (HTTP/1.1: no client here speaks HTTP/2)."""
    return httpx.create_ssl_context()


def server_options(cert_file: Path | None, key_file: Path | None, client_ca_file: Path | None) -> dict[str, Any]:
    """uvicorn's TLS options: none (plain HTTP) without a certificate; with `client_ca_file`, mutual TLS."""
    if cert_file is None:
        return {}
    options: dict[str, Any] = {"ssl_certfile": str(cert_file), "ssl_keyfile": str(key_file) if key_file else None}
    if client_ca_file is not None:
        options |= {"ssl_ca_certs": str(client_ca_file), "ssl_cert_reqs": ssl.CERT_REQUIRED}
    return options
