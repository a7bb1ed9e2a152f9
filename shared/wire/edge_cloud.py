"""Messages between an edge and the cloud (the edge's contribution header is core's: shared.core.reports)."""
from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import Field

from fl_services.shared.core.config import RunConfig
from fl_services.shared.core.reports import Id, Labels, Message


# ---- edge -> cloud ----------------------------------------------------------------------------
class EdgeRegistration(Message):
    """An edge's registration, repeated as its site report: who it is, where it is, what it serves."""

    max_body_bytes: ClassVar[int] = 8 * 2**10
    edge_id: int = Id
    url: str | None = Field(None, max_length=500)
    # The site: a stable name (unset: edge-<edge_id>) and labels a run's selection may name.
    name: str | None = Field(None, min_length=1, max_length=63, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")
    labels: Labels = Field(default_factory=dict)
    # What the edge serves now: the devices registered at it, and its last round as "run_id:version".
    devices: int | None = Field(None, ge=0, le=10**7)
    serving: str | None = Field(None, max_length=200)
    # The site's X25519 public key (base64) for secure aggregation between sites: a run with
    # secure_aggregation.cloud takes its sites' keys when it is created, and each site masks its sum with them.
    mask_key: str | None = Field(None, min_length=44, max_length=44)

    @property
    def site_name(self) -> str:
        return self.name or f"edge-{self.edge_id}"


# ---- cloud -> edge ----------------------------------------------------------------------------
class GlobalStateHeader(Message):
    run_id: str
    version: int
    config: RunConfig
    # Per edge, seconds its contribution waited for the others of the update that made this version, negative
    # for the last to arrive (the DVFS slack policy: an edge whose contribution waits is off the critical path).
    buffer_waits: dict[int, Annotated[float, Field(ge=-1e9, le=1e9, allow_inf_nan=False)]] = Field(
        default_factory=dict)


class RunEnd(Message):
    """A run that no longer trains, as the cloud tells the edges still running a round of it (the end
    long-poll): they drop that round at once instead of waiting for its deadline."""

    run_id: str
    status: Literal["stopped", "finished", "deleted"]


class SubmitReceipt(Message):
    accepted: bool
    duplicate: bool = False
    buffered: int
