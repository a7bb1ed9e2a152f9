"""Messages of the control API (an administrator, fedctl and the dashboard with the cloud) and of /health."""
from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import Field

from fl_services.shared.core.config import RunConfig
from fl_services.shared.core.data.summary import DataSummary
from fl_services.shared.core.numbers import Float, Int
from fl_services.shared.core.reports import FailureKind, Labels, Message, RoundRecord, RunStatus
from fl_services.shared.wire.edge_cloud import DeviceBrief, DeviceState, LabelSetCount, SiteRefusal, SiteRun
from fl_services.shared.wire.protocol import TOKEN_ID

# What an administrator may do to a run (POST /api/v1/runs/{run_id}/<action>).
RunAction = Literal["start", "pause", "resume", "stop"]


class RunInfo(Message):
    run_id: str
    status: RunStatus
    config: RunConfig
    version: Int
    rounds: Int
    buffered: Int
    created_at: datetime
    started_at: datetime | None = None
    finished_at: datetime | None = None
    last_round: RoundRecord | None = None
    # What a waiting run waits for (its devices: how many came, how many fit); why it stopped, where the cloud
    # stopped it: a selection's devices never came, or every device failed the round ("every device failed in
    # round N (...): client k (kind): what it reported"; cloud/services/sites.py).
    reason: str | None = None


# ---- security (admin <-> cloud, cloud -> edge) -----------------------------------------------------
# A per-device token's id (shared/wire/protocol.py, device_token): what revoking it names.
TokenId = Annotated[str, Field(pattern=f"^{TOKEN_ID.pattern}$")]


class Revocation(Message):
    """What an administrator posts to revoke one device's token."""

    token_id: TokenId


class RevokedToken(Revocation):
    revoked_at: datetime


class AuditRecord(Message):
    """One administrative action, kept in the cloud's audit log (a capped Redis stream)."""

    at: datetime
    actor: str  # who: the name of the admin token used ("admin", or one of admin_tokens), or "retention"
    address: str | None = None  # the caller's network address, as the cloud saw it
    action: str  # create | start | pause | resume | stop | delete | revoke
    target: str  # the run id, or the token id
    detail: str | None = None


# ---- the federation that exists (admin <-> cloud, operator <-> edge) --------------------------------
class SiteInfo(Message):
    """A site (an edge) as the cloud's site registry knows it, from its registration and its reports."""

    name: str
    edge_id: Int
    labels: Labels = Field(default_factory=dict)
    url: str | None = None
    registered_at: datetime
    last_seen: datetime
    devices: Int | None = None  # registered at it, as it last reported
    serving: str | None = None  # its last round, "run_id:version"
    # Online while its reports arrive (cloud/services/sites.py says offline after a few intervals without one);
    # None as stored: the registry keeps what was reported, the reader's clock decides.
    status: Literal["online", "offline"] | None = None
    report_s: Float | None = None
    states: dict[DeviceState, Int] = Field(default_factory=dict)  # its devices counted per state
    device_page: list[DeviceBrief] = Field(default_factory=list)  # the first of them, failed ones first
    runs: list[SiteRun] = Field(default_factory=list)  # the current round of each run it serves
    label_sets: list[LabelSetCount] | None = None  # its connected devices per label set (the most common)
    mask_key: str | None = None  # its public key for secure aggregation between sites (base64 X25519)


class DeviceInfo(Message):
    """A device as its edge's device registry knows it."""

    client_id: Int
    state: DeviceState  # as edge_cloud.DeviceState says
    labels: Labels = Field(default_factory=dict)
    summary: DataSummary | None = None
    registered_at: datetime
    last_seen: datetime
    runs: list[str] = Field(default_factory=list)  # the runs whose task for it is open
    failure: str | None = None  # why it could not train its task, while that task is on the board
    failure_kind: FailureKind | None = None  # that failure's kind


# ---- health (anyone) --------------------------------------------------------------------------
class CloudHealth(Message):
    status: Literal["ok"] = "ok"
    service: Literal["cloud"] = "cloud"


class EdgeHealth(Message):
    status: Literal["ok"] = "ok"
    service: Literal["edge"] = "edge"
    edge_id: Int
    clients: Int  # registered logical clients
    run_id: str | None = None  # the run of the last global state it received
    version: Int | None = None


# ---- cloud -> dashboard (admin) -----------------------------------------------------------------
class EdgeStatus(Message):
    """One edge of a run as the cloud sees it: its last contribution and whether one waits in the buffer."""

    edge_id: Int
    registered: bool
    waiting: bool  # a contribution of this edge is in the buffer, not yet consumed by a cloud update
    base_version: Int | None = None  # the version its last contribution was computed on
    # Waiting: how stale it would be if consumed now (run version − base_version); else as recorded.
    staleness: Int | None = None
    received_at: datetime | None = None  # when the waiting contribution was accepted
    consumed_in: Int | None = None  # the version whose cloud update consumed its last contribution
    consumed: Int = 0  # how many of its contributions the run consumed


class RunEdges(Message):
    """The buffer of a run against B, and each of its edges."""

    run_id: str
    version: Int
    buffer_size: Int  # B
    buffered: Int
    edges: list[EdgeStatus]


class RunUpdate(Message):
    """One event of a run's live stream (`GET /api/v1/runs/{id}/events`)."""

    info: RunInfo
    edges: RunEdges
    # Mean and spread (population std) over clients of their latest reports, per client group.
    groups: dict[str, dict[str, tuple[Float, Float]]]
    rounds: list[RoundRecord]  # history records this stream has not sent before


class RunSite(Message):
    """One site of a run as its last report says: the run's current round there, and its devices in it."""

    name: str | None = None  # None: the run names an edge that never registered as a site
    edge_id: Int
    status: Literal["online", "offline"] | None = None
    version: Int | None = None  # the global version of the run's current round there
    tasks: Int = 0
    answered: Int = 0
    failed: Int = 0
    devices: list[DeviceBrief] = Field(default_factory=list)  # listed devices with a task of the run, or failing it
    members: Int | None = None  # a run over registered devices: its members here, as the site last tried a round
    refused: list[SiteRefusal] = Field(default_factory=list)  # devices its selection takes that cannot train it


class SampleOutlier(Message):
    """A device of the run's last recorded round whose claimed training sample count is far above the round's
    median (cloud/services/sites.py, sample_outliers): its weight in a mean rests on a claim no one can check."""

    client_id: Int
    edge_id: Int
    num_samples: Int
    median: Float  # of the round's claimed counts


class RunSites(Message):
    """The sites and devices a run uses (`GET /api/v1/runs/{id}/sites`); all_failed: at every one of its sites, every
    device given a task of its current version reported it could not train it (the run cannot progress: a running
    one is stopped, cloud/services/sites.py)."""

    run_id: str
    sites: list[RunSite]
    all_failed: bool
    reasons: list[str] = Field(default_factory=list)  # the distinct reasons of the listed failed devices
    # The devices of the last recorded round (the history's) whose sample count is an outlier, and that round.
    sample_outliers: list[SampleOutlier] = Field(default_factory=list)
    outliers_round: Int | None = None
