"""Every Redis key the cloud uses, built in this one module (Redis-specific: the layout of the Redis adapter)."""
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
    reason = "reason"  # why the cloud stopped it, where it did


class Entry(StrEnum):
    """The fields of a buffer stream entry (`Keys.buffer`)."""

    blob_key = "blob_key"  # the key of the contribution as received (safetensors): `Keys.contribution`
    blob_file = "blob_file"  # or the name of the file holding it, in the blob directory (`BlobFiles`)
    header = "header"  # its EdgeContributionHeader JSON
    blob = "blob"  # written before blob_key: the contribution itself, inline (read, never written)


@dataclass(frozen=True)
class Keys:
    prefix: str = "fl"

    @property
    def runs(self) -> str:  # list of run ids in creation order
        return f"{self.prefix}:runs"

    @property
    def active(self) -> str:  # set of the ids of the runs that are running or paused (any number at once)
        return f"{self.prefix}:active_runs"

    @property
    def legacy_active(self) -> str:  # before several runs: the one active run's id (a string), migrated at start
        return f"{self.prefix}:active"

    @property
    def events(self) -> str:  # pub/sub channel: a run changed (new version, status); every replica listens
        return f"{self.prefix}:events"

    @property
    def edges(self) -> str:  # hash edge_id -> registration JSON
        return f"{self.prefix}:edges"

    @property
    def sites(self) -> str:  # hash site name -> SiteInfo JSON (the site registry)
        return f"{self.prefix}:sites"

    @property
    def site_names(self) -> str:  # hash edge_id -> its site's name (an index of `sites`, written with it)
        return f"{self.prefix}:site-names"

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

    def member_sites(self, run_id: str) -> str:  # hash device id -> the edge whose accepted contribution first
        # declared it: a run over registered devices holds each device at that one site
        return f"{self.prefix}:run:{run_id}:member-sites"

    def contribution(self, run_id: str, token: str) -> str:
        # One contribution's safetensors blob: written by a plain SET (with a TTL) before the submit script,
        # which makes it permanent and names it in its buffer entry, or deletes it if it refuses it.
        return f"{self.prefix}:run:{run_id}:contribution:{token}"

    def swept_blob_file(self, name: str) -> str:
        # The tombstone of a blob file a sweep deleted as an orphan (with a TTL): a submit script that runs after
        # it refuses to reference the file.
        return f"{self.prefix}:swept-blob-file:{name}"

    def lease(self, run_id: str) -> str:  # the replica computing the run's next update: a token, with a TTL
        return f"{self.prefix}:run:{run_id}:lease"

    def history(self, run_id: str) -> str:  # list of RoundRecord JSON, one per cloud update
        return f"{self.prefix}:run:{run_id}:history"

    def run_keys(self, run_id: str) -> list[str]:
        """Every key of one run: what deleting it removes."""
        return [self.meta(run_id), self.global_state(run_id), self.cloud_state(run_id), self.buffer(run_id),
                self.idempotency(run_id), self.slots(run_id), self.pending(run_id), self.history(run_id),
                self.lease(run_id), self.member_sites(run_id)]
