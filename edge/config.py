from __future__ import annotations

import tempfile
from pathlib import Path

from pydantic import Field, TypeAdapter, model_validator
from pydantic_settings import SettingsConfigDict

from fl_services.shared.core.reports import Labels, parse_labels
from fl_services.shared.runtime.settings import ca_file_field, cert_file_field, key_file_field
from fl_services.shared.server.settings import ServerSettings
from fl_services.shared.wire.edge_cloud import site_name


class EdgeSettings(ServerSettings):
    """Edge settings: env FL_EDGE_<NAME>, or a TOML file named by FL_EDGE_CONFIG_FILE."""

    model_config = SettingsConfigDict(env_prefix="FL_EDGE_", extra="forbid")

    edge_id: int = Field(0, ge=0, description=(
        "This edge's index l: it takes part in every run with topology.num_edges > l; in a run without a "
        "selection (a simulated federation) it serves the clients k with k mod num_edges = l, in a run with one "
        "the devices registered here."))
    name: str | None = Field(None, min_length=1, max_length=63, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$",
                             description=(
        "The site this edge is: a stable name (unset: edge-<edge_id>), registered with the cloud, where a run's "
        "selection may name it."))
    labels: str = Field("", description=(
        'The site\'s labels, e.g. "region=eu,tier=gold", registered with the cloud: a run\'s selection may name '
        "them."))
    site_report_s: float = Field(10.0, gt=0, description=(
        "How often the edge reports to the cloud's site registry (its devices per state and the first 50 of them, "
        "each run's current round, its last round): its last seen; the cloud calls it offline after three "
        "intervals without a report. A device that registers, goes offline or comes back, and a run that ends, "
        "are reported within a tenth of it (a second at most), so a run waiting for devices is admitted, and an "
        "ended run's sites show its devices idle, without waiting for the next report."))
    host: str = Field("127.0.0.1", description=(
        "The address to listen on. Beyond loopback (0.0.0.0, a LAN address) the development client token is "
        "refused."))
    port: int = Field(8100, description="The port to listen on.")
    cloud_url: str = Field("http://127.0.0.1:8000", description="Where the edge reaches the cloud (it dials out).")
    cloud_ca_file: Path | None = ca_file_field("an https:// cloud_url")
    cloud_cert_file: Path | None = cert_file_field("the edge", "the cloud")
    cloud_key_file: Path | None = key_file_field("cloud_cert_file")
    edge_token: str = Field("dev-edge-token", description="The bearer token presented to the cloud.")
    client_token: str = Field("dev-client-token", description=(
        "Expected from clients: this secret (every client), or a device token derived from it (one client)."))
    revocation_refresh_s: float = Field(10.0, gt=0, description=(
        "How often the edge fetches the revoked device tokens from the cloud: a revoked token works at most this "
        "long after its revocation (and, while the cloud is unreachable, until the edge reaches it again)."))
    public_url: str | None = Field(None, description=(
        "Where clients reach this edge (reported to the cloud for operators; clients dial out to it)."))
    max_payload_bytes: int = Field(64 * 2**20, gt=0, description=(
        "The largest body a tensor route (a client's result) accepts: 413 beyond."))
    long_poll_max_s: float = Field(25.0, gt=0, description=(
        "How long the edge's long-poll of the cloud asks to be held (the cloud cuts it to its own "
        "long_poll_max_s)."))
    state_dir: Path | None = Field(Path(tempfile.gettempdir()) / "fl-edge-state", description=(
        "Where the edge keeps its algorithm state (e.g. every client's last prototypes), one file per run, "
        "so a restarted edge continues where it stopped. On by default: an edge that forgets reports only "
        "the clients of its next round, and the others silently drop out of the global prototypes. "
        "Point it at durable storage in production (docker-compose mounts a volume); unset: memory only."))
    max_client_samples: int | None = Field(None, ge=1, description=(
        "Where the edge cannot derive a client's sample count (an imported data loader, an npz file it does not "
        "hold), a result's claim counts at most this many samples: a device cannot take a round's weight over "
        "by claiming 10^12 (docs/explanation-security-model.md). Unset: no cap. Where it can, a wrong claim is "
        "refused (422)."))
    slowdown: float = Field(1.0, ge=1.0, le=100.0, description=(
        "≥ 1: the edge waits (slowdown − 1) × each round's duration before it submits, to emulate a slow "
        "site (asynchronous-buffer experiments); 1 means no delay."))

    @property
    def site_name(self) -> str:
        """The site this edge is, as the cloud's site registry and a site-bound device token name it."""
        return site_name(self.name, self.edge_id)

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
