from __future__ import annotations

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from shared.settings import ServiceSettings


class EdgeSettings(ServiceSettings):
    """Edge settings: env FL_EDGE_<NAME>, or a TOML file named by FL_EDGE_CONFIG_FILE."""

    model_config = SettingsConfigDict(env_prefix="FL_EDGE_", extra="forbid")

    edge_id: int = Field(0, ge=0)
    host: str = "127.0.0.1"
    port: int = 8100
    cloud_url: str = "http://127.0.0.1:8000"
    # Presented to the cloud.
    edge_token: str = "dev-edge-token"
    # Expected from clients.
    client_token: str = "dev-client-token"
    # Where clients reach this edge (reported to the cloud for operators; clients dial out to it).
    public_url: str | None = None
    max_payload_bytes: int = Field(64 * 2**20, gt=0)
    long_poll_max_s: float = Field(25.0, gt=0)
    log_level: str = "info"
