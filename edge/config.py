from __future__ import annotations

import tempfile
from pathlib import Path

from pydantic import Field, TypeAdapter, model_validator
from pydantic_settings import SettingsConfigDict

from fl_services.shared.core.reports import Labels, parse_labels
from fl_services.shared.server.settings import ServerSettings


class EdgeSettings(ServerSettings):
    """Edge settings: env FL_EDGE_<NAME>, or a TOML file named by FL_EDGE_CONFIG_FILE."""

    model_config = SettingsConfigDict(env_prefix="FL_EDGE_", extra="forbid")

    edge_id: int = Field(0, ge=0)
    # The site this edge is: a stable name (unset: edge-<edge_id>) and labels, e.g. "region=eu,tier=gold",
    # registered with the cloud, where a run's selection may name them.
    name: str | None = Field(None, min_length=1, max_length=63, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")
    labels: str = ""
    # How often the edge reports to the cloud's site registry (its devices, its last round): its last seen.
    site_report_s: float = Field(10.0, gt=0)
    host: str = "127.0.0.1"
    port: int = 8100
    cloud_url: str = "http://127.0.0.1:8000"
    # An https:// cloud_url is verified against this CA bundle (PEM; unset: the public CAs); with
    # cloud_cert_file (and its key, unless in the same file) the edge presents that certificate (mutual TLS).
    cloud_ca_file: Path | None = None
    cloud_cert_file: Path | None = None
    cloud_key_file: Path | None = None
    # Presented to the cloud.
    edge_token: str = "dev-edge-token"
    # Expected from clients: this secret (every client), or a device token derived from it (one client).
    client_token: str = "dev-client-token"
    # How often the edge fetches the revoked device tokens from the cloud: a revoked token works at most this
    # long after its revocation (and, while the cloud is unreachable, until the edge reaches it again).
    revocation_refresh_s: float = Field(10.0, gt=0)
    # Where clients reach this edge (reported to the cloud for operators; clients dial out to it).
    public_url: str | None = None
    max_payload_bytes: int = Field(64 * 2**20, gt=0)
    long_poll_max_s: float = Field(25.0, gt=0)
    # Where the edge keeps its algorithm state (e.g. every client's last prototypes), one file per run,
    # so a restarted edge continues where it stopped. On by default: an edge that forgets reports only
    # the clients of its next round, and the others silently drop out of the global prototypes.
    # Point it at durable storage in production (docker-compose mounts a volume); None: memory only.
    state_dir: Path | None = Path(tempfile.gettempdir()) / "fl-edge-state"
    # Where the edge cannot derive a client's sample count (an imported data loader, an npz file it does not
    # hold), a result's claim counts at most this many samples: a device cannot take a round's weight over
    # by claiming 10^12 (README, Security). None: no cap. Where it can, a wrong claim is refused (422).
    max_client_samples: int | None = Field(None, ge=1)
    # ≥ 1: the edge waits (slowdown − 1) × each round's duration before it submits, to emulate a slow
    # site (asynchronous-buffer experiments); 1 means no delay.
    slowdown: float = Field(1.0, ge=1.0, le=100.0)

    @property
    def label_map(self) -> dict[str, str]:
        return parse_labels(self.labels)

    @model_validator(mode="after")
    def _labels_parse(self) -> "EdgeSettings":
        TypeAdapter(Labels).validate_python(self.label_map)  # a malformed label fails at start-up, saying which
        return self

    @model_validator(mode="after")
    def _secret_tokens_beyond_loopback(self) -> "EdgeSettings":
        # Only the token the edge checks: the one it presents is the cloud's to refuse.
        self.refuse_development_tokens(self.host, {"client_token": self.client_token})
        return self
