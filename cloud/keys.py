"""Every Redis key the cloud uses, built in this one module."""
from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Meta(StrEnum):
    """The fields of a run's meta hash (`Keys.meta`)."""

    config = "config"  # RunConfig JSON
    status = "status"  # a RunStatus value
    version = "version"  # the global state's version
    created_at = "created_at"  # ISO timestamps
    started_at = "started_at"
    finished_at = "finished_at"


class Entry(StrEnum):
    """The fields of a buffer stream entry (`Keys.buffer`)."""

    blob = "blob"  # the contribution as received (safetensors)
    header = "header"  # its EdgeContributionHeader JSON


@dataclass(frozen=True)
class Keys:
    prefix: str = "fl"

    @property
    def runs(self) -> str:  # list of run ids in creation order
        return f"{self.prefix}:runs"

    @property
    def active(self) -> str:  # id of the run that is running or paused (one at a time)
        return f"{self.prefix}:active"

    @property
    def edges(self) -> str:  # hash edge_id -> registration JSON
        return f"{self.prefix}:edges"

    @property
    def audit(self) -> str:  # capped stream of AuditRecord JSON: who did what to which run or token
        return f"{self.prefix}:audit"

    @property
    def revoked_tokens(self) -> str:  # hash token id -> RevokedToken JSON (per-device tokens refused by edges)
        return f"{self.prefix}:revoked_tokens"

    def meta(self, run_id: str) -> str:  # hash: config, status, version, timestamps
        return f"{self.prefix}:run:{run_id}:meta"

    def global_state(self, run_id: str) -> str:  # safetensors blob of the current global state
        return f"{self.prefix}:run:{run_id}:global"

    def cloud_state(self, run_id: str) -> str:  # safetensors blob of the algorithm's server memory
        return f"{self.prefix}:run:{run_id}:cloud_state"

    def buffer(self, run_id: str) -> str:  # stream of accepted, not yet aggregated contributions
        return f"{self.prefix}:run:{run_id}:buffer"

    def idempotency(self, run_id: str) -> str:  # hash idempotency key -> stream entry id
        return f"{self.prefix}:run:{run_id}:idem"

    def slots(self, run_id: str) -> str:  # hash "edge:base_version" -> idempotency key
        return f"{self.prefix}:run:{run_id}:slots"

    def pending(self, run_id: str) -> str:  # hash edge_id -> stream entry id of its unconsumed contribution
        return f"{self.prefix}:run:{run_id}:pending"

    def history(self, run_id: str) -> str:  # list of RoundRecord JSON, one per cloud update
        return f"{self.prefix}:run:{run_id}:history"

    def run_keys(self, run_id: str) -> list[str]:
        """Every key of one run: what deleting it removes."""
        return [self.meta(run_id), self.global_state(run_id), self.cloud_state(run_id), self.buffer(run_id),
                self.idempotency(run_id), self.slots(run_id), self.pending(run_id), self.history(run_id)]
