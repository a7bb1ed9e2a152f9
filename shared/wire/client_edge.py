"""Messages between a client process and its edge."""
from __future__ import annotations

from typing import Annotated, ClassVar

from pydantic import Field

from fl_services.shared.core.config import RunConfig
from fl_services.shared.core.data.summary import DataSummary
from fl_services.shared.core.numbers import Float, Int
from fl_services.shared.core.reports import (
    MAX_SAMPLES,
    ClientParticipation,
    FailureText,
    Id,
    Labels,
    Message,
    ReportedFailure,
    Scalar,
)


# ---- client -> edge ---------------------------------------------------------------------------
class ClientRegistration(Message):
    client_id: Int = Id
    num_samples: Int = Field(0, ge=0, le=MAX_SAMPLES)
    # What the client says about itself (e.g. its torch threads): kept by the edge, so bounded.
    capabilities: dict[Annotated[str, Field(max_length=64)],
                       Annotated[str, Field(max_length=200)] | bool | Int | Scalar] = Field(default_factory=dict,
                                                                                             max_length=64)
    # A device describes itself: free-form labels a run's device selection may name, and its data as it
    # summarised it (no samples leave it). Unset from a simulation worker, whose data is a run's partition.
    labels: Labels = Field(default_factory=dict)
    summary: DataSummary | None = None


class ClientResultHeader(ClientParticipation):
    """What a client reports with its result: what the history will record of it (its participation), for
    the task it answers."""

    task_id: str = Field(min_length=1, max_length=64)
    # Wall time of local_update, exported by the edge (fl_client_train_seconds); None where a client does not say.
    train_seconds: Float | None = Field(None, ge=0, le=10**7, allow_inf_nan=False)


class ClientFailureReport(Message):
    """A task the client could not train; the edge stops waiting for it and the history shows why."""

    task_id: str = Field(min_length=1, max_length=64)
    client_id: Int = Id
    error: str = FailureText
    kind: ReportedFailure = "training"


class TaskPoll(Message):
    """A client process's batch long-poll: every open task of these logical clients, except those it holds."""

    max_body_bytes: ClassVar[int] = 2 * 2**20
    client_ids: list[Annotated[Int, Id]] = Field(min_length=1, max_length=100_000)
    # The task ids the process has already received and not answered yet (queued, training, or given up on):
    # without them, every poll would bring the same tasks back at once.
    holding: list[Annotated[str, Field(min_length=1, max_length=64)]] = Field(default_factory=list,
                                                                             max_length=100_000)
    timeout: Float = Field(20.0, ge=0, le=3600)
    # Each client's own token where the process holds one per client (client_tokens) rather than the secret:
    # a client whose token is refused (revoked) is left out of the answer, and named, while the others are served.
    tokens: dict[int, Annotated[str, Field(min_length=1, max_length=200)]] = Field(default_factory=dict,
                                                                                  max_length=100_000)


# ---- edge -> client ---------------------------------------------------------------------------
class ClientTaskHeader(Message):
    task_id: str
    run_id: str
    client_id: Int
    round: Int
    version: Int
    config: RunConfig
    # DVFS (deadline, slack): the modelled seconds the client's compute and upload may take; None: full speed.
    budget_s: Float | None = None
    # Under secure aggregation (config.secure_aggregation.edge): the name of the round's protocol, which binds
    # its keys and ciphertexts, shared by every task of the round. The result then goes through /secagg.
    secure_round: str | None = None


class ResultReceipt(Message):
    accepted: bool


class ResultOutcome(Message):
    """What became of one result of a result bundle: `status` the one the per-client route would have answered
    (202 accepted; 409 stale or duplicate, 404 unknown client, 422 invalid, 400 unreadable, 429 over the rate),
    `detail` why it was refused."""

    client_id: Int
    task_id: str
    status: Int
    detail: str | None = None

    @property
    def accepted(self) -> bool:
        return self.status == 202


class ResultBatchReceipt(Message):
    """The answer to a result bundle: one outcome per result, in the bundle's order."""

    results: list[ResultOutcome]
