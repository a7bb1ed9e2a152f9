"""Messages between an edge and the cloud (the edge's contribution header is core's: shared.core.reports)."""
from __future__ import annotations

from datetime import datetime
from typing import Annotated, ClassVar, Literal

from pydantic import Field, model_validator

from fl_services.shared.core.config import RunConfig
from fl_services.shared.core.data.summary import DataFit
from fl_services.shared.core.numbers import Float, Int
from fl_services.shared.core.reports import FailureKind, Id, Labels, Message

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
# A run's devices refused at a site (their data cannot train it) are reported up to this many, each reason shortened.
MAX_REFUSALS_SHOWN = 16
# The connected devices are counted per distinct label set, the most common this many sets: a run's device selector
# is matched against them when it is admitted (min_devices).
MAX_LABEL_SETS = 64
MAX_ID_RANGES = 64


class LabelSetCount(Message):
    """How many connected devices registered with exactly these labels and data of this fit."""

    labels: Labels = Field(default_factory=dict)
    devices: Int = Field(ge=1, le=10**7)
    # What their data can train (None: devices that registered no data summary, or an edge that does not say).
    fit: DataFit | None = None
    # Without a fit: their ids, as inclusive ranges (None: more than MAX_ID_RANGES, or an edge that does not say).
    # Such a device trains the partition its id names, so it can train a run only where its id is below the run's
    # data.num_clients.
    ids: list[tuple[Int, Int]] | None = Field(None, max_length=MAX_ID_RANGES)

    @model_validator(mode="after")
    def _ids_name_the_devices(self) -> LabelSetCount:
        if self.ids is None:
            return self
        if self.fit is not None:
            raise ValueError("ids are listed only for devices without a data fit")
        previous = -1
        for low, high in self.ids:
            if not previous < low <= high:
                raise ValueError("ids must be ascending, disjoint ranges [low, high] with low ≤ high")
            previous = high
        if sum(high - low + 1 for low, high in self.ids) != self.devices:
            raise ValueError(f"ids must name exactly the set's {self.devices} devices")
        return self


class DeviceBrief(Message):
    """One device in a site report: what the dashboard's topology view shows of it."""

    client_id: Int = Id
    state: DeviceState
    last_seen: datetime
    samples: Int | None = Field(None, ge=0)  # training samples, as its data summary says (None: a simulated one)
    family: str | None = Field(None, max_length=64)  # the model family it declares (label or capability "family")
    runs: list[Annotated[str, Field(max_length=64)]] = Field(default_factory=list, max_length=MAX_DEVICE_RUNS)
    failure: str | None = Field(None, max_length=FAILURE_SHOWN)  # why it could not train, shortened
    failure_kind: FailureKind | None = None  # that failure's kind
    failed_run: str | None = Field(None, max_length=64)  # the run of that task


class SiteRefusal(Message):
    """A device the run's device selection takes whose registration cannot train the run, and why."""

    client_id: Int = Id
    error: str = Field(min_length=1, max_length=FAILURE_SHOWN)


class SiteRun(Message):
    """A run's current round at a site: its version, its devices' tasks, and how many answered or failed. Every
    task failed (tasks > 0, failed = tasks) is the site saying that every device failed the round: the cloud stops a
    run all of whose sites say so of its current version (cloud/services/sites.py)."""

    run_id: str = Field(min_length=1, max_length=64)
    version: Int = Field(ge=0)
    tasks: Int = Field(ge=0)
    answered: Int = Field(ge=0)
    failed: Int = Field(ge=0)
    members: Int | None = Field(None, ge=0)  # None: not a run over registered devices, or no round yet
    refused: list[SiteRefusal] = Field(default_factory=list, max_length=MAX_REFUSALS_SHOWN)


class EdgeRegistration(Message):
    """An edge's registration, repeated as its site report: who it is, where it is, what it serves, and its
    devices: counted per state, the first MAX_REPORTED_DEVICES of them listed (failed ones first)."""

    max_body_bytes: ClassVar[int] = 256 * 2**10
    edge_id: Int = Id
    url: str | None = Field(None, max_length=500)
    # The site: a stable name (unset: edge-<edge_id>) and labels a run's selection may name.
    name: str | None = Field(None, min_length=1, max_length=63, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")
    labels: Labels = Field(default_factory=dict)
    # What the edge serves now: the devices registered at it, and its last round as "run_id:version".
    devices: Int | None = Field(None, ge=0, le=10**7)
    serving: str | None = Field(None, max_length=200)
    report_s: Float | None = Field(None, gt=0, le=86_400)  # how often it reports: when to call it offline
    states: dict[DeviceState, Annotated[Int, Field(ge=0, le=10**7)]] = Field(default_factory=dict)
    device_page: list[DeviceBrief] = Field(default_factory=list, max_length=MAX_REPORTED_DEVICES)
    runs: list[SiteRun] = Field(default_factory=list, max_length=MAX_SITE_RUNS)
    # The connected devices per label set (the MAX_LABEL_SETS most common); None: an edge that does not say.
    label_sets: list[LabelSetCount] | None = Field(None, max_length=MAX_LABEL_SETS)
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
    version: Int
    config: RunConfig
    # Per edge, seconds its contribution waited for the others of the update that made this version, negative
    # for the last to arrive (the DVFS slack policy: an edge whose contribution waits is off the critical path).
    buffer_waits: dict[int, Annotated[Float, Field(ge=-1e9, le=1e9, allow_inf_nan=False)]] = Field(
        default_factory=dict)


class RunEnd(Message):
    """A run that no longer trains, as the cloud tells the edges still running a round of it (the end
    long-poll): they drop that round at once instead of waiting for its deadline."""

    run_id: str
    status: Literal["stopped", "finished", "deleted"]


class SubmitReceipt(Message):
    accepted: bool
    duplicate: bool = False
    buffered: Int
