"""Messages between an edge and the cloud (the edge's contribution header is core's: shared.core.reports)."""
from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import Field

from fl_services.shared.core.config import RunConfig
from fl_services.shared.core.reports import Id, Message


# ---- edge -> cloud ----------------------------------------------------------------------------
class EdgeRegistration(Message):
    max_body_bytes: ClassVar[int] = 4 * 2**10
    edge_id: int = Id
    url: str | None = Field(None, max_length=500)


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
