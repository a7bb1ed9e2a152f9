"""The storage port in this process's memory: the Redis adapter's twin, for tests and for a single-process
development cloud (FL_CLOUD_STORAGE=memory, refused beyond loopback).

Nothing survives the process and no other process shares it, so it serves one replica only. Every method runs
without awaiting anything in between its reads and writes, so each is atomic on the event loop, as the Redis
adapter's scripts and transactions are on the server. Records are kept as JSON, as Redis keeps them, so a
caller never changes what is stored by changing what it read.
"""
from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone

from fl_services.cloud.storage.ports import (
    ACTIVE,
    ENDED,
    UPDATABLE,
    Action,
    BufferedContribution,
    Conflict,
    Lease,
    LeaseLost,
    MembersElsewhere,
    NotFound,
    Store,
    SubmitOutcome,
    allowed,
    check_state_sizes,
    deletable,
    lease_token,
    now,
    refusal,
    site_record,
)
from fl_services.shared.core.config import RunConfig
from fl_services.shared.core.reports import EdgeContributionHeader, RoundRecord, RunStatus
from fl_services.shared.wire.admin import AuditRecord, RevokedToken, RunInfo, SiteInfo
from fl_services.shared.wire.edge_cloud import EdgeRegistration


@dataclass
class _Run:
    config: str  # RunConfig JSON
    global_state: bytes
    created_at: datetime
    status: RunStatus = RunStatus.created
    version: int = 0
    started_at: datetime | None = None
    finished_at: datetime | None = None
    reason: str | None = None
    cloud_state: bytes | None = None
    history: list[str] = field(default_factory=list)  # RoundRecord JSON
    # By entry id, in acceptance order: the header's JSON, the blob and when it was accepted (epoch seconds).
    buffer: dict[str, tuple[str, bytes, float]] = field(default_factory=dict)
    idempotency: dict[str, str] = field(default_factory=dict)  # idempotency key -> entry id
    slots: dict[str, str] = field(default_factory=dict)  # "edge:base_version" -> idempotency key
    pending: dict[int, str] = field(default_factory=dict)  # edge -> its entry still in the buffer
    member_sites: dict[int, int] = field(default_factory=dict)  # device -> the edge that declared it first


class MemoryStore(Store):
    def __init__(self, max_value_bytes: int | None = None):
        self.max_value_bytes = max_value_bytes  # what one stored blob may hold (None: no limit)
        self._runs: dict[str, _Run] = {}  # in creation order
        self._edges: dict[int, str] = {}  # registration JSON
        self._sites: dict[str, str] = {}  # site name -> SiteInfo JSON
        self._site_names: dict[int, str] = {}  # edge id -> its site's name
        self._audit: list[str] = []  # AuditRecord JSON, oldest first
        self._revoked: dict[str, str] = {}  # RevokedToken JSON
        self._leases: dict[str, tuple[str, float]] = {}  # run -> (token, expiry on the monotonic clock)
        self._listeners: set[asyncio.Queue[str]] = set()
        self._last_entry = (0, -1)  # the latest entry id's (milliseconds, sequence)

    def _run(self, run_id: str) -> _Run:
        run = self._runs.get(run_id)
        if run is None:
            raise NotFound(f"unknown run {run_id!r}")
        return run

    # ---- runs --------------------------------------------------------------------------------------
    async def ping(self) -> None:
        """Always reachable."""

    async def migrate(self) -> None:
        """Nothing older to migrate: the state starts empty with the process."""

    async def create_run(self, run_id: str, config: RunConfig, initial_global: bytes) -> None:
        self._runs[run_id] = _Run(config.model_dump_json(), initial_global, now())

    async def config(self, run_id: str) -> RunConfig:
        return RunConfig.model_validate_json(self._run(run_id).config)

    async def status(self, run_id: str) -> tuple[RunStatus, int]:
        run = self._run(run_id)
        return run.status, run.version

    async def info(self, run_id: str) -> RunInfo:
        run = self._run(run_id)
        config = RunConfig.model_validate_json(run.config)
        return RunInfo(run_id=run_id, status=run.status, config=config, version=run.version, rounds=config.rounds,
                       buffered=len(run.buffer), created_at=run.created_at, started_at=run.started_at,
                       finished_at=run.finished_at, reason=run.reason,
                       last_round=RoundRecord.model_validate_json(run.history[-1]) if run.history else None)

    async def run_ids(self) -> list[str]:
        return list(self._runs)

    async def active_runs(self) -> list[str]:
        return sorted(run_id for run_id, run in self._runs.items() if run.status in ACTIVE)

    async def transition(self, run_id: str, action: Action, reason: str | None = None) -> RunStatus:
        run = self._run(run_id)
        run.status = allowed(action, run.status)
        if action in ("start", "wait", "admit"):
            run.started_at = now()
        if action == "admit":
            run.reason = None
        if action == "stop":
            run.finished_at, run.reason = now(), reason
        return run.status

    async def note_waiting(self, run_id: str, reason: str) -> None:
        run = self._run(run_id)
        if run.status != RunStatus.waiting:
            raise Conflict(f"run {run_id} is {run.status.value}, not waiting")
        run.reason = reason

    async def global_blob(self, run_id: str) -> bytes:
        return self._run(run_id).global_state

    async def versioned_global(self, run_id: str) -> tuple[int, bytes]:
        run = self._run(run_id)
        return run.version, run.global_state

    async def cloud_state_blob(self, run_id: str) -> bytes | None:
        return self._run(run_id).cloud_state

    async def history_since(self, run_id: str, start: int) -> list[RoundRecord]:
        return [RoundRecord.model_validate_json(r) for r in self._run(run_id).history[start:]]

    async def fill_evaluation(self, run_id: str, record: RoundRecord) -> bool:
        run = self._runs.get(run_id)
        if run is None or not 0 <= record.round < len(run.history):
            return False
        previous = RoundRecord.model_validate_json(run.history[record.round])
        if previous.version != record.version or not math.isnan(previous.test_accuracy):
            return False
        run.history[record.round] = record.model_dump_json()
        return True

    async def delete_run(self, run_id: str) -> None:
        deletable(self._run(run_id).status)
        del self._runs[run_id]
        self._leases.pop(run_id, None)

    async def ended_runs(self) -> list[tuple[str, datetime]]:
        return [(run_id, run.finished_at) for run_id, run in self._runs.items()
                if run.status in ENDED and run.finished_at is not None]

    # ---- the contribution buffer -------------------------------------------------------------------
    async def submit(self, header: EdgeContributionHeader, blob: bytes, synchronous: bool,
                     members: Sequence[int] = ()) -> SubmitOutcome:
        run = self._runs.get(header.run_id)
        if run is None:
            raise refusal(header, "not_running", "missing")
        slot, key = f"{header.edge_id}:{header.base_version}", header.idempotency_key
        if key in run.idempotency:
            if run.slots.get(slot) == key:
                return SubmitOutcome(True, True, len(run.buffer))
            raise refusal(header, "key_reused", run.idempotency[key])
        version = str(run.version)
        if run.status not in ACTIVE:
            raise refusal(header, "not_running", run.status.value)
        if header.base_version > run.version:
            raise refusal(header, "future", version)
        if synchronous and header.base_version != run.version:
            raise refusal(header, "stale", version)
        if slot in run.slots:
            raise refusal(header, "conflict", version)
        if header.edge_id in run.pending:
            raise refusal(header, "pending", version)
        held = {k: run.member_sites[k] for k in members if run.member_sites.get(k, header.edge_id) != header.edge_id}
        if held:
            raise MembersElsewhere(held)
        entry_id, received_s = self._entry_id()
        run.buffer[entry_id] = (header.model_dump_json(), blob, received_s)
        run.idempotency[key], run.slots[slot], run.pending[header.edge_id] = entry_id, key, entry_id
        for k in members:
            run.member_sites.setdefault(k, header.edge_id)
        return SubmitOutcome(True, False, len(run.buffer))

    def _entry_id(self) -> tuple[str, float]:
        """A new entry's id, "milliseconds-sequence", increasing as Redis stream ids do, and its time."""
        last_ms, last_seq = self._last_entry
        ms = max(int(time.time() * 1000), last_ms)
        self._last_entry = (ms, last_seq + 1 if ms == last_ms else 0)
        return f"{ms}-{self._last_entry[1]}", ms / 1000

    async def has_pending(self, run_id: str, edge_id: int) -> bool:
        run = self._runs.get(run_id)
        return run is not None and edge_id in run.pending

    async def buffered(self, run_id: str, count: int) -> list[BufferedContribution]:
        return [BufferedContribution(entry_id, EdgeContributionHeader.model_validate_json(header), blob, received_s)
                for entry_id, (header, blob, received_s) in self._entries(run_id)[:count]]

    async def buffered_headers(self, run_id: str) -> list[tuple[datetime, EdgeContributionHeader]]:
        return [(datetime.fromtimestamp(received_s, timezone.utc), EdgeContributionHeader.model_validate_json(header))
                for _, (header, _, received_s) in self._entries(run_id)]

    def _entries(self, run_id: str) -> list[tuple[str, tuple[str, bytes, float]]]:
        run = self._runs.get(run_id)
        return [] if run is None else list(run.buffer.items())

    async def commit_update(self, run_id: str, expected_version: int, consumed: list[BufferedContribution],
                            new_global: bytes, new_cloud_state: bytes, record: RoundRecord, finished: bool,
                            lease: Lease | None = None) -> bool:
        check_state_sizes(run_id, self.max_value_bytes, global_state=new_global, cloud_state=new_cloud_state)
        run = self._runs.get(run_id)
        if run is None or run.version != expected_version or run.status not in UPDATABLE:
            return False
        if lease is not None and not self._holds(lease):
            return False
        run.global_state, run.cloud_state, run.version = new_global, new_cloud_state, expected_version + 1
        run.history.append(record.model_dump_json())
        for c in consumed:
            run.buffer.pop(c.entry_id, None)
            run.pending.pop(c.header.edge_id, None)
        if finished:
            run.status, run.finished_at = RunStatus.finished, now()
        return True

    # ---- the update leases -------------------------------------------------------------------------
    def _holds(self, lease: Lease) -> bool:
        token, expiry = self._leases.get(lease.run_id, ("", 0.0))
        return token == lease.token and time.monotonic() < expiry

    async def acquire_lease(self, run_id: str, ttl_s: float, holder: str) -> Lease | None:
        if self._leases.get(run_id, ("", 0.0))[1] > time.monotonic():
            return None
        lease = Lease(run_id, lease_token(holder), ttl_s)
        self._leases[run_id] = (lease.token, time.monotonic() + ttl_s)
        return lease

    async def extend_lease(self, lease: Lease) -> None:
        if not self._holds(lease):
            raise LeaseLost(f"run {lease.run_id}: the update lease expired")
        self._leases[lease.run_id] = (lease.token, time.monotonic() + lease.ttl_s)

    async def release_lease(self, lease: Lease) -> None:
        if not self._holds(lease):
            raise LeaseLost(f"run {lease.run_id}: the update lease expired before it was released")
        del self._leases[lease.run_id]

    # ---- events ------------------------------------------------------------------------------------
    async def publish(self, message: str) -> None:
        for queue in self._listeners:
            queue.put_nowait(message)

    async def listen(self, subscribed: Callable[[], Awaitable[None]], heard: Callable[[str], Awaitable[None]]) -> None:
        queue: asyncio.Queue[str] = asyncio.Queue()
        self._listeners.add(queue)
        try:
            await subscribed()
            while True:
                await heard(await queue.get())
        finally:
            self._listeners.discard(queue)

    # ---- edges, audit, revocations -----------------------------------------------------------------
    async def register_edge(self, reg: EdgeRegistration) -> None:
        self._edges[reg.edge_id] = json.dumps({"edge_id": reg.edge_id, "url": reg.url,
                                               "registered_at": now().isoformat()})

    async def edge_known(self, edge_id: int) -> bool:
        return edge_id in self._edges

    async def registered_edges(self) -> set[int]:
        return set(self._edges)

    async def report_site(self, reg: EdgeRegistration) -> SiteInfo:
        earlier = self._sites.get(reg.site_name)
        record = site_record(reg, SiteInfo.model_validate_json(earlier) if earlier is not None else None)
        former = self._site_names.get(reg.edge_id)
        if former is not None and former != record.name:
            del self._sites[former]
        self._sites[record.name] = record.model_dump_json()
        self._site_names[reg.edge_id] = record.name
        return record

    async def sites(self) -> list[SiteInfo]:
        return [SiteInfo.model_validate_json(self._sites[name]) for name in sorted(self._sites)]

    async def remove_site(self, name: str) -> None:
        held = self._sites.pop(name, None)
        if held is None:
            raise NotFound(f"no site named {name!r}")
        edge_id = SiteInfo.model_validate_json(held).edge_id
        if self._site_names.get(edge_id) == name:
            del self._site_names[edge_id]

    async def audit(self, record: AuditRecord, max_entries: int) -> None:
        self._audit.append(record.model_dump_json())
        del self._audit[:-max_entries]

    async def audit_log(self, limit: int) -> list[AuditRecord]:
        return [AuditRecord.model_validate_json(r) for r in reversed(self._audit[-limit:])]

    async def revoke_token(self, token_id: str) -> RevokedToken:
        kept = self._revoked.setdefault(token_id, RevokedToken(token_id=token_id, revoked_at=now()).model_dump_json())
        return RevokedToken.model_validate_json(kept)

    async def revoked_tokens(self) -> list[RevokedToken]:
        return sorted((RevokedToken.model_validate_json(r) for r in self._revoked.values()), key=lambda r: r.revoked_at)
