"""Every message that crosses a process boundary, split by direction.

Binary messages (anything carrying tensors) travel as one safetensors document whose metadata holds
the header below (see shared.transport.tensors). Plain JSON is used only for control messages.
"""
from __future__ import annotations

from datetime import datetime
from enum import Enum
from typing import Annotated, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from shared.config import RunConfig
from shared.transport.wire import TOKEN_ID


class Message(BaseModel):
    # NaN stays NaN in JSON (a round nobody evaluated), instead of a null that would not read back.
    model_config = ConfigDict(extra="forbid", frozen=True, ser_json_inf_nan="constants")
    # The largest JSON body a route reading this message accepts (shared.web.read_json; 413 beyond): every
    # field is bounded, and this is far above their sum even with every character \u-escaped. Messages
    # that travel inside safetensors are bounded by the service's max_payload_bytes instead.
    max_body_bytes: ClassVar[int] = 64 * 2**10


Id = Field(ge=0, le=2**31 - 1)
# Far above any real data set, and small enough that weights stay finite floats.
MAX_SAMPLES = 10**12


class RunStatus(str, Enum):
    created = "created"
    running = "running"
    paused = "paused"
    stopped = "stopped"
    finished = "finished"


# ---- edge -> cloud ----------------------------------------------------------------------------
class EdgeRegistration(Message):
    max_body_bytes: ClassVar[int] = 4 * 2**10
    edge_id: int = Id
    url: str | None = Field(None, max_length=500)


# A loss or metric a client reports. Bounded so that the round's sample-weighted means (up to
# MAX_SAMPLES · MAX_SCALAR per client) stay finite: a reported -1e300 would make the history's loss -inf.
MAX_SCALAR = 1e15
Scalar = Annotated[float, Field(ge=-MAX_SCALAR, le=MAX_SCALAR, allow_inf_nan=False)]
Metrics = Annotated[dict[str, Scalar], Field(max_length=32)]


# The bounds of a device report's figures: a run whose devices would report more is refused at creation
# (cloud/initial_state.py), since its clients could send no result.
MAX_SECONDS = 1e9
MAX_ENERGY_J = 1e12
Seconds = Annotated[float, Field(ge=0, le=MAX_SECONDS, allow_inf_nan=False)]


class DeviceReport(Message):
    """What a client's device did for one task under the DVFS model (shared/dvfs.py): modelled, not measured."""

    backend: Literal["emulated", "cpufreq"]
    profile: str = Field(max_length=64)
    policy: str = Field(max_length=16)
    frequencies_ghz: list[Annotated[float, Field(gt=0, le=10)]] = Field(max_length=1000)  # per local epoch
    compute_s: Seconds  # modelled computation time, Σ c·|D|/f
    comm_s: Seconds  # modelled download + upload time at the link rate
    energy_j: Annotated[float, Field(ge=0, le=MAX_ENERGY_J, allow_inf_nan=False)]  # dynamic + static, computation
    full_speed_s: Seconds  # compute + comm at the top frequency: what the edge's deadline is made of
    budget_s: Seconds | None = None  # the modelled seconds the edge gave the task (deadline, slack)


class ClientParticipation(Message):
    client_id: int = Id
    num_samples: int = Field(ge=1, le=MAX_SAMPLES)
    loss: Scalar
    metrics: Metrics = Field(default_factory=dict)
    device: DeviceReport | None = None  # None: the result came from outside a client process (reference runner)


# What a client reports about a task it could not train (e.g. its environment cannot import the run's model
# factory or data loader): bounded, since it is stored in the history.
FailureText = Field(min_length=1, max_length=1000)


class ClientFailure(Message):
    client_id: int = Id
    error: str = FailureText


class EdgeContributionHeader(Message):
    run_id: str = Field(min_length=1, max_length=64)
    edge_id: int = Id
    base_version: int = Field(ge=0)
    idempotency_key: str = Field(min_length=1, max_length=200)
    weight: float = Field(gt=0, allow_inf_nan=False)
    clients: list[ClientParticipation] = Field(min_length=1)
    # Selected clients that reported they could not train their task this round.
    failures: list[ClientFailure] = Field(default_factory=list, max_length=100_000)


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


# ---- client -> edge ---------------------------------------------------------------------------
class ClientRegistration(Message):
    client_id: int = Id
    num_samples: int = Field(0, ge=0, le=MAX_SAMPLES)
    # What the client says about itself (e.g. its torch threads): kept by the edge, so bounded.
    capabilities: dict[Annotated[str, Field(max_length=64)],
                       Annotated[str, Field(max_length=200)] | bool | int | Scalar] = Field(default_factory=dict,
                                                                                             max_length=64)


class ClientResultHeader(ClientParticipation):
    """What a client reports with its result: what the history will record of it (its participation), for
    the task it answers."""

    task_id: str = Field(min_length=1, max_length=64)
    # Wall time of local_update, exported by the edge (fl_client_train_seconds); None from older clients.
    train_seconds: float | None = Field(None, ge=0, le=10**7, allow_inf_nan=False)


class ClientFailureReport(Message):
    """A task the client could not train; the edge stops waiting for it and the history shows why."""

    task_id: str = Field(min_length=1, max_length=64)
    client_id: int = Id
    error: str = FailureText


# ---- edge -> client ---------------------------------------------------------------------------
class ClientTaskHeader(Message):
    task_id: str
    run_id: str
    client_id: int
    round: int
    version: int
    config: RunConfig
    # DVFS (deadline, slack): the modelled seconds the client's compute and upload may take; None: full speed.
    budget_s: float | None = None


class ResultReceipt(Message):
    accepted: bool


# ---- control API (admin <-> cloud) ------------------------------------------------------------
class ClientRecord(Message):
    client_id: int
    edge_id: int
    num_samples: int
    loss: float
    metrics: dict[str, float] = Field(default_factory=dict)
    device: DeviceReport | None = None


class ClientFailureRecord(Message):
    client_id: int
    edge_id: int
    error: str


class ContributionRecord(Message):
    edge_id: int
    base_version: int
    staleness: int
    weight: float


class RoundRecord(Message):
    round: int
    version: int
    edges: list[int]
    clients: list[ClientRecord]
    # Selected clients that could not train (what each reported), e.g. lacking the run's model package.
    failed_clients: list[ClientFailureRecord] = Field(default_factory=list)
    contributions: list[ContributionRecord]
    train_loss: float
    test_loss: float
    test_accuracy: float
    # Sample-weighted means of what clients reported (e.g. pFedMe's personalised accuracy).
    client_metrics: dict[str, float] = Field(default_factory=dict)
    # What the algorithm's server_metrics hook reports after the update (e.g. hfpl's prototype accuracy).
    server_metrics: dict[str, float] = Field(default_factory=dict)
    # Modelled client energy (DVFS) of the results this update consumed, joules.
    energy_j: float = 0.0
    # ε spent at the run's privacy.delta after this round (its privacy accountant); None without privacy noise.
    epsilon: float | None = None
    # DP-SGD's ε (privacy.dp_sgd_noise_multiplier) per training example, for the least protected client, as if
    # every client trained in every round so far; None without DP-SGD.
    dp_sgd_epsilon: float | None = None
    started_at: datetime
    finished_at: datetime
    elapsed_s: float
    # The cloud replica that computed this update (FL_CLOUD_REPLICA_ID); None in the reference runner.
    computed_by: str | None = None


class RunInfo(Message):
    run_id: str
    status: RunStatus
    config: RunConfig
    version: int
    rounds: int
    buffered: int
    created_at: datetime
    started_at: datetime | None = None
    finished_at: datetime | None = None
    last_round: RoundRecord | None = None


# ---- security (admin <-> cloud, cloud -> edge) -----------------------------------------------------
# A per-device token's id (shared/transport/wire.py, device_token): what revoking it names.
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


# ---- health (anyone) --------------------------------------------------------------------------
class CloudHealth(Message):
    status: Literal["ok"] = "ok"
    service: Literal["cloud"] = "cloud"


class EdgeHealth(Message):
    status: Literal["ok"] = "ok"
    service: Literal["edge"] = "edge"
    edge_id: int
    clients: int  # registered logical clients
    run_id: str | None = None  # the run of the last global state it received
    version: int | None = None


# ---- cloud -> dashboard (admin) -----------------------------------------------------------------
class EdgeStatus(Message):
    """One edge of a run as the cloud sees it: its last contribution and whether one waits in the buffer."""

    edge_id: int
    registered: bool
    waiting: bool  # a contribution of this edge is in the buffer, not yet consumed by a cloud update
    base_version: int | None = None  # the version its last contribution was computed on
    # Waiting: how stale it would be if consumed now (run version − base_version); else as recorded.
    staleness: int | None = None
    received_at: datetime | None = None  # when the waiting contribution was accepted
    consumed_in: int | None = None  # the version whose cloud update consumed its last contribution
    consumed: int = 0  # how many of its contributions the run consumed


class RunEdges(Message):
    """The buffer of a run against B, and each of its edges."""

    run_id: str
    version: int
    buffer_size: int  # B
    buffered: int
    edges: list[EdgeStatus]


class RunUpdate(Message):
    """One event of a run's live stream (`GET /api/v1/runs/{id}/events`)."""

    info: RunInfo
    edges: RunEdges
    # Mean and spread (population std) over clients of their latest reports, per client group.
    groups: dict[str, dict[str, tuple[float, float]]]
    rounds: list[RoundRecord]  # history records this stream has not sent before
