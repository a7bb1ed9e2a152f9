"""The base of each service's settings class: environment variables over a TOML file over defaults.

Each service (cloud, edge, client) has exactly one settings class with its own env prefix, e.g.
FL_CLOUD_REDIS_URL; FL_CLOUD_CONFIG_FILE names an optional TOML file with the same keys.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Self

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, TomlConfigSettingsSource

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
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        config_file = os.environ.get(f"{prefix}CONFIG_FILE")
        if config_file:
            sources.append(TomlConfigSettingsSource(settings_cls, toml_file=config_file))
        return tuple(sources)


class ServerSettings(ServiceSettings):
    """What the two servers (cloud and edge) hold besides: HTTPS (README, Security) and their Prometheus metrics."""

    # Serve HTTPS with this certificate (chain, PEM) and its key (unset: the key is in the same file);
    # unset: plain HTTP.
    tls_cert_file: Path | None = None
    tls_key_file: Path | None = None
    # Mutual TLS: every caller must present a certificate this CA bundle (PEM) signed and that is valid now;
    # the handshake refuses any other before a byte of HTTP is read. Needs tls_cert_file.
    tls_client_ca_file: Path | None = None

    # False: no instrumentation at all (no request middleware, no counters, GET /metrics is 404).
    metrics: bool = True
    # GET /metrics is open, as Prometheus scrapers expect; set this to require it as a bearer token.
    metrics_token: str | None = None

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
