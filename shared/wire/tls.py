"""TLS for every HTTP hop, in one place: the ssl context a client (edge, client process, fedctl) verifies its
server with and presents its certificate from, and the options a server (cloud, edge) serves HTTPS with.

A client given no CA bundle trusts the public CAs (certifi's, as httpx does by default); a deployment with its
own CA (`fedctl certs`) names its ca.pem. A server given a client CA bundle requires every client to present a
certificate that CA signed and that is valid now (mutual TLS); the TLS handshake refuses any other before a
single byte of HTTP is read.
"""
from __future__ import annotations

import ssl
from pathlib import Path
from typing import Any

import httpx


def client_context(ca_file: Path | None = None, cert_file: Path | None = None,
                   key_file: Path | None = None) -> ssl.SSLContext:
    """Verifies the server's certificate chain and host name against `ca_file` (else the public CAs) and,
    with `cert_file` (and `key_file`, unless the key is in the same PEM), presents that certificate."""
    context = ssl.create_default_context(cafile=str(ca_file)) if ca_file else httpx.create_ssl_context()
    if cert_file is not None:
        context.load_cert_chain(cert_file, key_file)
    return context


def server_options(cert_file: Path | None, key_file: Path | None, client_ca_file: Path | None) -> dict[str, Any]:
    """uvicorn's TLS options: none (plain HTTP) without a certificate; with `client_ca_file`, mutual TLS."""
    if cert_file is None:
        return {}
    options: dict[str, Any] = {"ssl_certfile": str(cert_file), "ssl_keyfile": str(key_file) if key_file else None}
    if client_ca_file is not None:
        options |= {"ssl_ca_certs": str(client_ca_file), "ssl_cert_reqs": ssl.CERT_REQUIRED}
    return options
