"""What the two servers (cloud and edge) configure besides the base: TLS, limits, metrics."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Self

import limits
from pydantic import Field, field_validator, model_validator

from fl_services.shared.runtime.settings import ServiceSettings, is_development_token, is_loopback, key_file_field
from fl_services.shared.wire.tls import server_options


class ServerSettings(ServiceSettings):
    """What the two servers (cloud and edge) hold besides: HTTPS (docs/how-to-tls-and-tokens.md), their limits
    against load and abuse, their Prometheus metrics, and whether they may listen beyond loopback with the
    built-in development tokens."""

    tls_cert_file: Path | None = Field(None, description=(
        "Serve HTTPS with this certificate (chain, PEM); unset: plain HTTP."))
    tls_key_file: Path | None = key_file_field("tls_cert_file")
    tls_client_ca_file: Path | None = Field(None, description=(
        "Mutual TLS: every caller must present a certificate this CA bundle (PEM) signed and that is valid now; "
        "the handshake refuses any other before a byte of HTTP is read. Needs tls_cert_file."))

    allow_default_tokens: bool = Field(False, description=(
        "A server bound beyond loopback (e.g. 0.0.0.0) refuses to start while a token it checks is a built-in "
        "development token (dev-admin-token, dev-edge-token, dev-client-token, change-me-*): true allows it (a "
        "throwaway test network only)."))

    max_connections: int = Field(4096, ge=16, description=(
        "Connections served at once (uvicorn's limit_concurrency): past it a request is answered 503, which "
        "edges and clients retry. Every long-polling edge or client holds one: room for 1,000 of them and more."))
    header_timeout_s: float = Field(10.0, gt=0, description=(
        "Slowloris: a request's head must arrive within this many seconds of its connection opening, else the "
        "connection is closed (shared/server/deadlines.py); a body a route answered early is read no longer "
        "than that either."))
    body_timeout_s: float = Field(120.0, gt=0, description=(
        "A request's body must arrive within this many seconds of the request starting, else 408: a 64 MiB "
        "upload needs 0.5 MiB/s."))
    rate_limit: str = Field("20/second", description=(
        'Requests per caller on the routes a caller repeats (registration, results; the cloud: contributions), '
        'in the `limits` package\'s notation ("20/second", "100 per minute"): past it, 429 with Retry-After. '
        "The caller is the client (at an edge) or the edge (at the cloud) the request acts for, so a device "
        "with its own token can flood only its own allowance, and the many clients behind one operator's "
        "secret each have theirs."))
    max_open_per_caller: int = Field(4, ge=1, description=(
        "Requests per caller open at once on the routes that hold a connection long (an edge's task long-poll "
        "and result upload): past it, 429. A client holds one poll per logical client; retries after a dropped "
        "connection may overlap the old one for a while."))

    metrics: bool = Field(True, description=(
        "False: no instrumentation at all (no request middleware, no counters, GET /metrics is 404)."))
    metrics_token: str | None = Field(None, description=(
        "GET /metrics is open, as Prometheus scrapers expect; set this to require it as a bearer token "
        "(empty: unset)."))

    @field_validator("rate_limit")
    @classmethod
    def _a_rate(cls, rate: str) -> str:
        limits.parse(rate)  # ValueError: not a rate
        return rate

    @field_validator("metrics_token")
    @classmethod
    def _unset_if_empty(cls, token: str | None) -> str | None:
        # `FL_CLOUD_METRICS_TOKEN=` (an env file's empty line) means unset: as a token it would refuse
        # every scrape, since no request can carry an empty bearer token.
        return token or None

    @model_validator(mode="after")
    def _tls_needs_a_certificate(self) -> Self:
        orphans = [name for name in ("tls_key_file", "tls_client_ca_file") if getattr(self, name) is not None]
        if self.tls_cert_file is None and orphans:
            raise ValueError(f"{' and '.join(orphans)} given without tls_cert_file: the service would serve "
                             "plain HTTP")
        return self

    def tls_options(self) -> dict[str, Any]:
        """What `fl_services.shared.server.serve.serve` gives uvicorn: none for plain HTTP."""
        return server_options(self.tls_cert_file, self.tls_key_file, self.tls_client_ca_file)

    def refuse_development_tokens(self, host: str, tokens: dict[str, str]) -> None:
        """Raises ValueError (the settings are invalid: the service does not start) if the server listens
        beyond loopback with a development token among `tokens` (field name -> the token it checks)."""
        if self.allow_default_tokens or is_loopback(host):
            return
        prefix = self.model_config.get("env_prefix", "")
        known = [name for name, token in tokens.items() if is_development_token(token)]
        if known:
            variables = ", ".join(f"{prefix}{name.upper()}" for name in known)
            raise ValueError(
                f"{variables}: a built-in development token, and the service listens on {host}, beyond loopback, "
                f"where anyone who has read this repository could use it. Set a secret (the variable, or "
                f"{prefix}<NAME>_FILE naming a file that holds it), listen on 127.0.0.1, or set "
                f"{prefix}ALLOW_DEFAULT_TOKENS=true on a throwaway network")
