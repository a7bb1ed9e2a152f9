"""Every message that crosses a process boundary, split by direction.

Binary messages (anything carrying tensors) travel as one safetensors document whose metadata holds
the header below (see shared.transport.tensors). Plain JSON is used only for control messages.
"""
from __future__ import annotations

from datetime import datetime
from enum import Enum
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from shared.config import RunConfig


class Message(BaseModel):
    # NaN stays NaN in JSON (a round nobody evaluated), instead of a null that would not read back.
    model_config = ConfigDict(extra="forbid", frozen=True, ser_json_inf_nan="constants")


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
    edge_id: int = Id
    url: str | None = Field(None, max_length=500)


# A loss or metric a client reports. Bounded so that the round's sample-weighted means (up to
# MAX_SAMPLES · MAX_SCALAR per client) stay finite: a reported -1e300 would make the history's loss -inf.
MAX_SCALAR = 1e15
Scalar = Annotated[float, Field(ge=-MAX_SCALAR, le=MAX_SCALAR, allow_inf_nan=False)]
Metrics = Annotated[dict[str, Scalar], Field(max_length=32)]


class ClientParticipation(Message):
    client_id: int = Id
    num_samples: int = Field(ge=1, le=MAX_SAMPLES)
    loss: Scalar
    metrics: Metrics = Field(default_factory=dict)


class EdgeContributionHeader(Message):
    run_id: str = Field(min_length=1, max_length=64)
    edge_id: int = Id
    base_version: int = Field(ge=0)
    idempotency_key: str = Field(min_length=1, max_length=200)
    weight: float = Field(gt=0, allow_inf_nan=False)
    clients: list[ClientParticipation] = Field(min_length=1)


# ---- cloud -> edge ----------------------------------------------------------------------------
class GlobalStateHeader(Message):
    run_id: str
    version: int
    config: RunConfig


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


class ClientResultHeader(Message):
    task_id: str = Field(min_length=1, max_length=64)
    client_id: int = Id
    num_samples: int = Field(ge=1, le=MAX_SAMPLES)
    loss: Scalar
    metrics: Metrics = Field(default_factory=dict)
    # Wall time of local_update, exported by the edge (fl_client_train_seconds); None from older clients.
    train_seconds: float | None = Field(None, ge=0, le=10**7, allow_inf_nan=False)


# ---- edge -> client ---------------------------------------------------------------------------
class ClientTaskHeader(Message):
    task_id: str
    run_id: str
    client_id: int
    round: int
    version: int
    config: RunConfig


class ResultReceipt(Message):
    accepted: bool


# ---- control API (admin <-> cloud) ------------------------------------------------------------
class ClientRecord(Message):
    client_id: int
    edge_id: int
    num_samples: int
    loss: float
    metrics: dict[str, float] = Field(default_factory=dict)


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
    contributions: list[ContributionRecord]
    train_loss: float
    test_loss: float
    test_accuracy: float
    # Sample-weighted means of what clients reported (e.g. pFedMe's personalised accuracy).
    client_metrics: dict[str, float] = Field(default_factory=dict)
    started_at: datetime
    finished_at: datetime
    elapsed_s: float


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
