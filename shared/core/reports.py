"""What clients and edges report of their work (participations, failures, an edge's contribution) and
the history's round records made of them. The wire carries them; the rounds and the reference runner build them."""
from __future__ import annotations

import math
import typing
from datetime import datetime
from enum import Enum
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, WithJsonSchema

from fl_services.shared.core.numbers import Float, Int


class Message(BaseModel):
    # A float with no value (NaN: a round nobody evaluated yet) is null in JSON: strict parsers refuse NaN and
    # Infinity, which are not JSON. Figure fields read null back as NaN.
    model_config = ConfigDict(extra="forbid", frozen=True, ser_json_inf_nan="null")
    # The largest JSON body a route reading this message accepts (shared.server.bodies.read_json; 413 beyond): every
    # field is bounded, and this is far above their sum even with every character \u-escaped. Messages
    # that travel inside safetensors are bounded by the service's max_payload_bytes instead.
    max_body_bytes: ClassVar[int] = 64 * 2**10


Id = Field(ge=0, le=2**31 - 1)


def _nan_from_null(value: Any) -> Any:
    return math.nan if value is None else value


# A figure that may not exist yet (a test loss before the cloud evaluated the round): NaN in Python, so that
# arithmetic and comparisons need no None case, and null in JSON, as the schema says.
Figure = Annotated[Float, BeforeValidator(_nan_from_null),
                   WithJsonSchema({"anyOf": [{"type": "number"}, {"type": "null"}]})]


# Free-form key=value labels of a site or a device (e.g. region=eu), which a run's selection may name.
Labels = Annotated[dict[Annotated[str, Field(min_length=1, max_length=63, pattern=r"^[A-Za-z0-9_./-]+$")],
                        Annotated[str, Field(max_length=63)]], Field(max_length=32)]


def parse_labels(text: str) -> dict[str, str]:
    """Labels written as "region=eu,tier=gold" (a setting, a command line); ValueError for a malformed one."""
    labels: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"label {item!r} is not key=value")
        labels[key.strip()] = value.strip()
    return labels


# Far above any real data set, and small enough that weights stay finite floats.
MAX_SAMPLES = 10**12


class RunStatus(str, Enum):
    created = "created"
    waiting = "waiting"  # started, waiting for the devices its selection needs (RunConfig.selection)
    running = "running"
    paused = "paused"
    stopped = "stopped"
    finished = "finished"


# A loss or metric a client reports. Bounded so that the round's sample-weighted means (up to
# MAX_SAMPLES · MAX_SCALAR per client) stay finite: a reported -1e300 would make the history's loss -inf.
MAX_SCALAR = 1e15


Scalar = Annotated[Float, Field(ge=-MAX_SCALAR, le=MAX_SCALAR, allow_inf_nan=False)]


Metrics = Annotated[dict[str, Scalar], Field(max_length=32)]


# The bounds of a device report's figures: a run whose devices would report more is refused at creation
# (cloud/initial_state.py), since its clients could send no result.
MAX_SECONDS = 1e9


MAX_ENERGY_J = 1e12


Seconds = Annotated[Float, Field(ge=0, le=MAX_SECONDS, allow_inf_nan=False)]


class DeviceReport(Message):
    """What a client's device did for one task under the DVFS model (shared/core/dvfs.py): modelled, not measured."""

    backend: Literal["emulated", "cpufreq"]
    profile: str = Field(max_length=64)
    policy: str = Field(max_length=16)
    frequencies_ghz: list[Annotated[Float, Field(gt=0, le=10)]] = Field(max_length=1000)  # per local epoch
    compute_s: Seconds  # modelled computation time, Σ c·|D|/f
    comm_s: Seconds  # modelled download + upload time at the link rate
    energy_j: Annotated[Float, Field(ge=0, le=MAX_ENERGY_J, allow_inf_nan=False)]  # dynamic + static, computation
    full_speed_s: Seconds  # compute + comm at the top frequency: what the edge's deadline is made of
    budget_s: Seconds | None = None  # the modelled seconds the edge gave the task (deadline, slack)


class HeldOut(Message):
    """A model's figures on devices' own held-out splits, weighted by their samples: one device's, one site's
    (its devices'), or a version's (its sites') (RunConfig.evaluation "federated" or "both")."""

    loss: Scalar
    accuracy: Float = Field(ge=0, le=1, allow_inf_nan=False)
    num_samples: Int = Field(ge=1, le=MAX_SAMPLES)


class SiteHeldOut(HeldOut):
    """One site's (edge's) evaluation of a version on its devices' held-out splits."""

    edge_id: Int = Id


class FederatedEvaluation(HeldOut):
    """A global version evaluated by the devices that received it, on their held-out splits, before training on
    it: the sample-weighted mean over its sites, each the sample-weighted mean over its devices."""

    version: Int = Field(ge=0, description="the global version the devices evaluated (the one their task carried)")
    sites: list[SiteHeldOut] = Field(description="per site (edge id), what its devices evaluated")


class ClientParticipation(Message):
    client_id: Int = Id
    num_samples: Int = Field(ge=1, le=MAX_SAMPLES)
    loss: Scalar
    metrics: Metrics = Field(default_factory=dict)
    device: DeviceReport | None = None  # None: the result came from outside a client process (reference runner)
    # The device's evaluation of the global model its task carried, on its held-out split, before it trained: only
    # in a run with federated evaluation, in the first edge round of a version, from a device with held-out samples.
    evaluation: HeldOut | None = None


# What a client reports about a task it could not train (e.g. its environment cannot import the run's model
# factory or data loader): bounded, since it is stored in the history.
FailureText = Field(min_length=1, max_length=1000)


# Why a device failed a task, as a small closed set (a metric's label, a column). What a device reports of itself:
# misfit: its data does not fit the run (refused at the edge, or found by the device); user_code: the run's model
# or data code cannot be imported or run there; data: its own data cannot be read; malformed_task: the task it got
# cannot be read; refused_result: the edge refused its result (e.g. beyond the bounds); training: any other error
# while it trained. The error text says the rest.
ReportedFailure = Literal["misfit", "user_code", "data", "malformed_task", "refused_result", "training"]
REPORTED_FAILURES: tuple[ReportedFailure, ...] = typing.get_args(ReportedFailure)
# And what its edge finds of a task left unanswered when the round closed (never reported by a device): offline:
# the device went silent while its task was open (its round stopped waiting for it then); timeout: it was still
# heard from but did not answer within the round's deadline (and retries).
FailureKind = Literal[ReportedFailure, "offline", "timeout"]
FAILURE_KINDS: tuple[FailureKind, ...] = typing.get_args(FailureKind)


class ClientFailure(Message):
    client_id: Int = Id
    error: str = FailureText
    kind: FailureKind = "training"


class Member(Message):
    """A device among a run's members at an edge for one round."""

    client_id: Int = Id
    num_samples: Int | None = Field(None, ge=0, le=MAX_SAMPLES)
    # The labels it registered with: a cluster map may place devices by label (ClusterFedVARP's `clusters`).
    labels: Labels = Field(default_factory=dict)


class LatePart(Message):
    """Late answers (policy.late = 'join') that came with an edge's contribution: those computed on `base_version`,
    their weighted sum travelling in the tensor groups named `<group>@<base_version>` (shared/core/late.py)."""

    base_version: Int = Field(ge=0)
    weight: Float = Field(gt=0, allow_inf_nan=False)
    clients: list[ClientParticipation] = Field(min_length=1, max_length=100_000)


class EdgeContributionHeader(Message):
    run_id: str = Field(min_length=1, max_length=64)
    edge_id: Int = Id
    base_version: Int = Field(ge=0)
    idempotency_key: str = Field(min_length=1, max_length=200)
    weight: Float = Field(gt=0, allow_inf_nan=False)
    clients: list[ClientParticipation] = Field(min_length=1)
    # Selected clients that reported they could not train their task this round.
    failures: list[ClientFailure] = Field(default_factory=list, max_length=100_000)
    # The run's members at this edge for the round (the devices it selected from), with their sample counts
    # where the edge knows them: the cloud checks `clients` against these. None: an edge that declares none.
    members: list[Member] | None = Field(None, max_length=1_000_000)
    # The site's evaluation of base_version: the sample-weighted mean of its clients' `evaluation`s (None: none).
    evaluation: HeldOut | None = None
    # Answers of the edge's earlier rounds that came after those closed (policy.late = 'join'), per base version.
    late: list[LatePart] = Field(default_factory=list, max_length=1000)


# ---- control API (admin <-> cloud) ------------------------------------------------------------
class ClientRecord(Message):
    client_id: Int
    edge_id: Int
    num_samples: Int
    loss: Float
    metrics: dict[str, Float] = Field(default_factory=dict)
    device: DeviceReport | None = None
    evaluation: HeldOut | None = None  # of the version its task carried, on its held-out split


class ClientFailureRecord(Message):
    client_id: Int
    edge_id: Int
    error: str
    kind: FailureKind = "training"  # records kept before kinds existed read back as training


class ContributionRecord(Message):
    edge_id: Int
    base_version: Int
    staleness: Int
    weight: Float
    # The devices the edge selected from (a run over registered devices; None: the simulated roster): who was
    # registered for the run at that edge in that round, from which the reference runner replays the joins.
    members: list[Int] | None = None
    # s(τ) its step counted with (RunConfig.topology.staleness; 1 in a synchronous run), and whether it was
    # dropped instead, staler than topology.staleness.max.
    staleness_weight: Float = 1.0
    dropped: bool = False
    # Late answers (policy.late = 'join'): this step is theirs, computed on base_version, and came with the edge's
    # contribution listed before it in the same record; `clients` are those devices.
    joined: bool = False
    clients: list[Int] | None = None


class RoundRecord(Message):
    round: Int
    version: Int
    edges: list[Int]
    clients: list[ClientRecord]
    # Selected clients that could not train (what each reported), e.g. lacking the run's model package.
    failed_clients: list[ClientFailureRecord] = Field(default_factory=list)
    contributions: list[ContributionRecord]
    train_loss: Figure
    test_loss: Figure = Field(description="on the test set the cloud loads (RunConfig.evaluation 'cloud' or "
                              "'both'): null until the cloud has evaluated the round's model, and always with "
                              "'federated'")
    test_accuracy: Figure = Field(description="on the test set the cloud loads: null as test_loss")
    federated: list[FederatedEvaluation] = Field(default_factory=list, description=(
        "on the devices' held-out splits (RunConfig.evaluation 'federated' or 'both'): per global version the "
        "contributions of this update were computed on (one for a synchronous run: `round`, the version this "
        "update started from), what the devices that trained on it evaluated"))
    # Sample-weighted means of what clients reported (e.g. pFedMe's personalised accuracy).
    client_metrics: dict[str, Figure] = Field(default_factory=dict)
    # What the algorithm's server_metrics hook reports after the update (e.g. hfpl's prototype accuracy).
    server_metrics: dict[str, Figure] = Field(default_factory=dict)
    # Modelled client energy (DVFS) of the results this update consumed, joules; None: not measured (a run that
    # models no device, RunConfig.dvfs.modelled).
    energy_j: Float | None = None
    # ε spent at the run's privacy.delta after this round (its privacy accountant); None without privacy noise.
    epsilon: Float | None = None
    # DP-SGD's ε (privacy.dp_sgd_noise_multiplier) per training example, for the least protected client, as if
    # every client trained in every round so far; None without DP-SGD.
    dp_sgd_epsilon: Float | None = None
    started_at: datetime
    finished_at: datetime
    elapsed_s: Float
    # The cloud replica that computed this update (FL_CLOUD_REPLICA_ID); None in the reference runner.
    computed_by: str | None = None
