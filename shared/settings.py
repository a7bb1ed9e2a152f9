"""The base of each service's settings class: environment variables over a TOML file over defaults.

Each service (cloud, edge, client) has exactly one settings class with its own env prefix, e.g.
FL_CLOUD_REDIS_URL; FL_CLOUD_CONFIG_FILE names an optional TOML file with the same keys.
"""
from __future__ import annotations

import os

import limits
from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, TomlConfigSettingsSource

from shared.log import LogFormat


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
    """What the two servers (cloud and edge) hold besides: their limits against load and abuse, and their
    Prometheus metrics."""

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
