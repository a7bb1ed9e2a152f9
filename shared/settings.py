"""The base of each service's settings class: environment variables over a TOML file over defaults.

Each service (cloud, edge, client) has exactly one settings class with its own env prefix, e.g.
FL_CLOUD_REDIS_URL; FL_CLOUD_CONFIG_FILE names an optional TOML file with the same keys.
"""
from __future__ import annotations

import ipaddress
import os
from pathlib import Path
from typing import Any, Self, TypeVar

import limits
from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsError, TomlConfigSettingsSource

from shared.log import LogFormat
from shared.transport.tls import server_options


class ServiceSettings(BaseSettings):
    """What every service's settings hold: its torch threads and its logging."""

    # Torch's intra-op threads for the service's tensor work (training, client_task, edge_aggregate,
    # cloud_update); 1 by default, so that equal configs give equal models (README, Determinism).
    torch_threads: int = Field(1, ge=1)
    log_level: str = "info"
    # "json": one JSON object per line, with run_id, edge_id and client_id fields (shared/log.py).
    log_format: LogFormat = "text"

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        prefix = settings_cls.model_config.get("env_prefix", "")
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings, SettingFiles(settings_cls)]
        config_file = os.environ.get(f"{prefix}CONFIG_FILE")
        if config_file:
            sources.append(TomlConfigSettingsSource(settings_cls, toml_file=config_file))
        return tuple(sources)


class SettingFiles(PydanticBaseSettingsSource):
    """`<PREFIX><NAME>_FILE=path` (e.g. FL_CLOUD_ADMIN_TOKEN_FILE=/run/secrets/admin_token): the setting is that
    file's content, its final newline dropped. Docker secrets arrive as such files, so a token need not
    sit in an environment variable (visible to `docker inspect` and every process of the container) nor
    in a compose file. The variable itself (FL_CLOUD_ADMIN_TOKEN) wins where both are set."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        raise NotImplementedError  # __call__ reads every field at once

    def __call__(self) -> dict[str, Any]:
        prefix = self.settings_cls.model_config.get("env_prefix", "")
        values: dict[str, Any] = {}
        for name, field in self.settings_cls.model_fields.items():
            variable = f"{prefix}{name.upper()}_FILE"
            path = os.environ.get(variable)
            if not path:
                continue
            try:
                text = Path(path).read_text().removesuffix("\n").removesuffix("\r")
                # A dict or list setting (e.g. the cloud's admin_tokens) is JSON, as in its variable.
                values[name] = self.decode_complex_value(name, field, text) if self.field_is_complex(field) else text
            except (OSError, UnicodeDecodeError, ValueError) as exc:
                raise SettingsError(f"{variable}={path}: cannot read it: {exc}") from exc
        return values


# The tokens the settings default to, and the placeholders docker-compose used to fill in: anyone who has read
# this repository knows them.
DEVELOPMENT_TOKENS = frozenset({"dev-admin-token", "dev-edge-token", "dev-client-token"})


def is_development_token(token: str) -> bool:
    return token in DEVELOPMENT_TOKENS or token.startswith("change-me")


def is_loopback(host: str) -> bool:
    """Whether a server bound to `host` is reachable from this machine only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # another host name: it may resolve to anything
        return False


class ServerSettings(ServiceSettings):
    """What the two servers (cloud and edge) hold besides: HTTPS (README, Security), their limits against load
    and abuse, their Prometheus metrics, and whether they may listen beyond loopback with the built-in
    development tokens."""

    # Serve HTTPS with this certificate (chain, PEM) and its key (unset: the key is in the same file);
    # unset: plain HTTP.
    tls_cert_file: Path | None = None
    tls_key_file: Path | None = None
    # Mutual TLS: every caller must present a certificate this CA bundle (PEM) signed and that is valid now;
    # the handshake refuses any other before a byte of HTTP is read. Needs tls_cert_file.
    tls_client_ca_file: Path | None = None

    # A server bound beyond loopback (e.g. 0.0.0.0) refuses to start while a token it checks is a built-in
    # development token (DEVELOPMENT_TOKENS, change-me-*): true allows it (a throwaway test network only).
    allow_default_tokens: bool = False

    # Connections served at once (uvicorn's limit_concurrency): past it a request is answered 503, which
    # edges and clients retry. Every long-polling edge or client holds one: room for 1,000 of them and more.
    max_connections: int = Field(4096, ge=16)
    # Slowloris: a request's head must arrive within header_timeout_s of its connection opening (else the
    # connection is closed), and its body within body_timeout_s of the request starting (else 408). The
    # body's deadline leaves a 64 MiB upload 0.5 MiB/s.
    header_timeout_s: float = Field(10.0, gt=0)
    body_timeout_s: float = Field(120.0, gt=0)
    # Requests per caller on the routes a caller repeats (registration, results; the cloud: contributions),
    # in the `limits` package's notation ("20/second", "100 per minute"): past it, 429 with Retry-After.
    # The caller is the client (at an edge) or the edge (at the cloud) the request acts for, so a device
    # with its own token can flood only its own allowance, and the many clients behind one operator's
    # secret each have theirs.
    rate_limit: str = "20/second"
    # Requests per caller open at once on the routes that hold a connection long (an edge's task long-poll
    # and result upload): past it, 429. A client holds one poll per logical client; retries after a dropped
    # connection may overlap the old one for a while.
    max_open_per_caller: int = Field(4, ge=1)

    # False: no instrumentation at all (no request middleware, no counters, GET /metrics is 404).
    metrics: bool = True
    # GET /metrics is open, as Prometheus scrapers expect; set this to require it as a bearer token.
    metrics_token: str | None = None

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
        """What `shared.web.serve` gives uvicorn: none for plain HTTP."""
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


S = TypeVar("S", bound=BaseSettings)


def load_settings(settings_cls: type[S]) -> S:
    """The service's settings, or exit with one line per problem (status 2). Never pydantic's own report:
    it repeats the input, tokens included."""
    try:
        return settings_cls()
    except ValidationError as exc:
        prefix = settings_cls.model_config.get("env_prefix", "")
        problems = [f"{prefix}{str(e['loc'][0]).upper()}: {e['msg']}" if e["loc"] else e["msg"].removeprefix(
            "Value error, ") for e in exc.errors(include_url=False, include_input=False)]
        raise SystemExit("invalid settings: " + "; ".join(problems)) from None
    except SettingsError as exc:
        raise SystemExit(f"invalid settings: {exc}") from None
