"""Messages between an edge and the cloud (the edge's contribution header is core's: shared.core.reports)."""
from __future__ import annotations

from datetime import datetime
from typing import Annotated, ClassVar, Literal

from pydantic import Field

from fl_services.shared.core.config import RunConfig
from fl_services.shared.core.reports import Id, Labels, Message

# ---- edge -> cloud ----------------------------------------------------------------------------
# What a device is doing as its edge sees it. training: a task of it is open; uploading: its result is arriving;
# failed: it reported it could not train a task still on the board; offline: not heard from for a while.
DeviceState = Literal["idle", "training", "uploading", "failed", "offline"]
DEVICE_STATES: tuple[DeviceState, ...] = ("failed", "uploading", "training", "idle", "offline")

# A site report lists at most this many devices (the rest are counted per state): a site with 10,000 devices
# must not make every report, and the cloud's registry record of it, grow with them.
MAX_REPORTED_DEVICES = 50
# A listed device's failure is shortened to this many characters, its open runs and the site's runs are capped.
FAILURE_SHOWN = 300
MAX_DEVICE_RUNS = 16
MAX_SITE_RUNS = 64


class DeviceBrief(Message):
    """One device in a site report: what the dashboard's topology view shows of it."""

    client_id: int = Id
    state: DeviceState
    last_seen: datetime
    samples: int | None = Field(None, ge=0)  # training samples, as its data summary says (None: a simulated one)
    family: str | None = Field(None, max_length=64)  # the model family it declares (label or capability "family")
    runs: list[Annotated[str, Field(max_length=64)]] = Field(default_factory=list, max_length=MAX_DEVICE_RUNS)
    failure: str | None = Field(None, max_length=FAILURE_SHOWN)  # why it could not train, shortened
    failed_run: str | None = Field(None, max_length=64)  # the run of that task


class SiteRun(Message):
    """A run's current round at a site: its devices' tasks, and how many answered or failed."""

    run_id: str = Field(min_length=1, max_length=64)
    tasks: int = Field(ge=0)
    answered: int = Field(ge=0)
    failed: int = Field(ge=0)


class EdgeRegistration(Message):
    """An edge's registration, repeated as its site report: who it is, where it is, what it serves, and its
    devices: counted per state, the first MAX_REPORTED_DEVICES of them listed (failed ones first)."""

    max_body_bytes: ClassVar[int] = 256 * 2**10
    edge_id: int = Id
    url: str | None = Field(None, max_length=500)
    # The site: a stable name (unset: edge-<edge_id>) and labels a run's selection may name.
    name: str | None = Field(None, min_length=1, max_length=63, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")
    labels: Labels = Field(default_factory=dict)
    # What the edge serves now: the devices registered at it, and its last round as "run_id:version".
    devices: int | None = Field(None, ge=0, le=10**7)
    serving: str | None = Field(None, max_length=200)
    report_s: float | None = Field(None, gt=0, le=86_400)  # how often it reports: when to call it offline
    states: dict[DeviceState, Annotated[int, Field(ge=0, le=10**7)]] = Field(default_factory=dict)
    device_page: list[DeviceBrief] = Field(default_factory=list, max_length=MAX_REPORTED_DEVICES)
    runs: list[SiteRun] = Field(default_factory=list, max_length=MAX_SITE_RUNS)
    # The site's X25519 public key (base64) for secure aggregation between sites: a run with
    # secure_aggregation.cloud takes its sites' keys when it is created, and each site masks its sum with them.
    mask_key: str | None = Field(None, min_length=44, max_length=44)

    @property
    def site_name(self) -> str:
        return site_name(self.name, self.edge_id)


def site_name(name: str | None, edge_id: int) -> str:
    """An edge's site name: its own, or edge-<edge_id> where it sets none."""
    return name or f"edge-{edge_id}"


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
