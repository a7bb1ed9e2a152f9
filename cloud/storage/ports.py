"""The cloud's storage port: what the routes, the orchestrator and the background tasks may ask of the
storage, in small interfaces, with the domain's types and exceptions.

A backend implements `Store` (every interface below) and passes tests/cloud/storage/test_contract.py
(docs/how-to-storage-backend.md). Nothing of a backend's own crosses this port: not its client library's
exceptions (translated into StorageUnavailable or StorageError), not its keys, not its ids' format.

Invariants every backend keeps, so that a crash loses nothing and counts nothing twice:
- `submit` is atomic: the idempotency key, the run's status and version, the edge's slot and its entry
  still waiting, and the site holding each device it declares (a run over registered devices) are checked, and
  the contribution buffered (its devices' site recorded), all at once or not at all;
- `commit_update` is atomic: the new global state and cloud state, the new version, the history record and
  the removal of the consumed contributions happen together, only if the version is still the expected one,
  the run still running (not paused: UPDATABLE), and (given a lease) that lease still held. Until then the consumed
  entries stay buffered, so a cloud killed mid-update redoes it.
"""
from __future__ import annotations

import secrets
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Literal, Protocol

from fl_services.shared.core.config import RunConfig
from fl_services.shared.core.reports import EdgeContributionHeader, RoundRecord, RunStatus
from fl_services.shared.wire.admin import AuditRecord, RevokedToken, RunInfo, SiteInfo
from fl_services.shared.wire.edge_cloud import EdgeRegistration


def now() -> datetime:
    """The time the storage stamps on what it records (runs' start and end, audit records, revocations)."""
    return datetime.now(timezone.utc)


# ---- exceptions ------------------------------------------------------------------------------------
class NotFound(Exception):
    """Unknown run or edge id (HTTP 404)."""


class Conflict(Exception):
    """A request that is well-formed but not allowed in the run's current state (HTTP 409)."""

    def __init__(self, message: str, reason: str = "conflict"):
        super().__init__(message)
        self.reason = reason  # the refusal's name in the metrics (cloud/metrics.py)


class MembersElsewhere(Conflict):
    """A contribution declaring devices that another site holds in the run (HTTP 409 naming them): `holders`,
    device -> edge."""

    def __init__(self, holders: dict[int, int]):
        super().__init__(f"devices {sorted(holders)} are members of this run at another site "
                         f"({', '.join(f'{k} at edge {e}' for k, e in sorted(holders.items()))}): a device is one "
                         "member of the federation; leave them out of this site's round", "member_elsewhere")
        self.holders = holders


class StateTooLarge(ValueError):
    """A cloud update whose result the storage cannot hold: the run cannot go on."""


class LeaseLost(Exception):
    """The lease is no longer held by whoever holds this token: it expired (and another may hold it now)."""


class StorageError(Exception):
    """The storage failed; a backend's own error, translated (HTTP 500)."""


class StorageUnavailable(StorageError):
    """The storage cannot be reached now (down, restarting, too slow, no connection free): HTTP 503, which
    edges retry as they retry any 5xx, rather than a 500 with a traceback for every request."""


class StorageRefused(StorageError):
    """The storage answers but will not let the cloud in (credentials, TLS): retrying cannot help, so the cloud
    does not start."""


# ---- domain types ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class BufferedContribution:
    entry_id: str  # the buffer's id of the entry (opaque to callers; entries come in acceptance order)
    header: EdgeContributionHeader
    blob: bytes
    received_s: float  # when the buffer accepted it, in the storage's clock (seconds since the epoch)
    blob_ref: str | None = None  # where the backend keeps the blob apart from the entry: its own business


@dataclass(frozen=True)
class SubmitOutcome:
    accepted: bool
    duplicate: bool
    buffered: int


@dataclass(frozen=True)
class Lease:
    """The right to publish a run's next cloud update, held until `ttl_s` after it was taken or last extended.
    Opaque: only the storage that issued it reads `token`; a commit given it is fenced by it."""

    run_id: str
    token: str
    ttl_s: float


def lease_token(holder: str) -> str:
    """A token no other acquisition gets: the holder's name (seen by an operator), then random bits."""
    return f"{holder}:{secrets.token_hex(8)}"


Action = Literal["start", "wait", "admit", "pause", "resume", "stop"]
# Which transitions each control action allows.
TRANSITIONS: dict[str, tuple[set[RunStatus], RunStatus]] = {
    "start": ({RunStatus.created}, RunStatus.running),
    # A run over registered devices starts by waiting for them, and is admitted once they are there.
    "wait": ({RunStatus.created}, RunStatus.waiting),
    "admit": ({RunStatus.waiting}, RunStatus.running),
    "pause": ({RunStatus.running}, RunStatus.paused),
    "resume": ({RunStatus.paused}, RunStatus.running),
    "stop": ({RunStatus.created, RunStatus.waiting, RunStatus.running, RunStatus.paused}, RunStatus.stopped),
}
# The statuses of an active run: it takes contributions (kept in the buffer) and cannot be deleted.
ACTIVE = frozenset({RunStatus.running, RunStatus.paused})
# The status in which an update may be published: a paused run's version holds from the pause's answer until it
# resumes, and what arrives meanwhile is applied then (docs/decisions/pause-holds-the-version.md).
UPDATABLE = frozenset({RunStatus.running})
ENDED = frozenset({RunStatus.stopped, RunStatus.finished})


def allowed(action: str, current: RunStatus) -> RunStatus:
    """The status `action` takes a run in `current` to; Conflict if it may not."""
    sources, target = TRANSITIONS[action]
    if current not in sources:
        raise Conflict(f"cannot {action} a run that is {current.value}")
    return target


def deletable(current: RunStatus) -> None:
    if current in ACTIVE:
        raise Conflict(f"cannot delete a run that is {current.value}; stop it first")


def refusal(header: EdgeContributionHeader, outcome: str, detail: str) -> Conflict:
    """The Conflict a refused submission raises, by the refusal's name (ContributionBuffer.submit);
    members_elsewhere's detail: the devices another edge holds, as "device:edge" comma-separated."""
    if outcome == "members_elsewhere":
        return MembersElsewhere({int(k): int(e) for k, _, e in (pair.partition(":") for pair in detail.split(","))})
    messages = {
        "not_running": f"run is {detail}, not accepting contributions",
        "future": f"base_version {header.base_version} is newer than the run's version {detail}",
        "stale": f"stale submission: base_version {header.base_version}, current version {detail}",
        "conflict": f"edge {header.edge_id} already submitted for version {header.base_version} "
                    "under another idempotency key",
        "key_reused": f"idempotency key {header.idempotency_key!r} was used for another contribution "
                      "(another edge or version); a retry must repeat its own key, a new submission "
                      "needs a new one",
        "pending": f"edge {header.edge_id} already has a contribution waiting in the buffer; "
                   "it gets a new global state once that one is consumed",
    }
    return Conflict(messages[outcome], outcome)


def check_state_sizes(run_id: str, limit: int | None, **blobs: bytes) -> None:
    """StateTooLarge if a blob of a cloud update is over what one stored value may hold (None: no limit)."""
    for what, blob in blobs.items():
        if limit is not None and len(blob) > limit:
            raise StateTooLarge(f"run {run_id}: the new {what.replace('_', ' ')} takes {len(blob) / 2**20:.0f} "
                                f"MiB, over the {limit // 2**20} MiB a stored value can hold")


# ---- the interfaces --------------------------------------------------------------------------------
class Runs(Protocol):
    """Runs: their config and status, the global state and the algorithm's cloud state, the history."""

    def new_run_id(self) -> str:
        return secrets.token_hex(6)

    async def ping(self) -> None:
        """Raises StorageUnavailable if the storage cannot be reached (the health route's check)."""

    async def migrate(self) -> None:
        """Brings what an older version of the backend wrote to today's layout (idempotent; every replica may
        do it at start). A backend with nothing to migrate does nothing."""

    async def create_run(self, run_id: str, config: RunConfig, initial_global: bytes) -> None: ...
    async def config(self, run_id: str) -> RunConfig: ...
    async def status(self, run_id: str) -> tuple[RunStatus, int]:
        """The run's status and version."""
    async def info(self, run_id: str) -> RunInfo:
        """The run as the control API shows it: `rounds` is its config's rounds, `buffered` the contributions
        waiting, `last_round` its newest history record, `finished_at` when it stopped or finished (as
        ended_runs), `reason` as transition and note_waiting keep it."""

    async def infos(self, run_ids: list[str]) -> list[RunInfo]:
        """The runs' infos, leaving out those deleted meanwhile."""
        # One by one: a run deleted between the listing of ids and its read (another admin, retention) is left
        # out, rather than the whole list answering 404 "unknown run".
        infos = []
        for run_id in run_ids:
            try:
                infos.append(await self.info(run_id))
            except NotFound:
                continue
        return infos

    async def run_ids(self) -> list[str]:
        """Every run's id, in creation order."""
    async def active_runs(self) -> list[str]:
        """The runs that are running or paused, sorted by id (a stable order for every replica)."""
    async def transition(self, run_id: str, action: Action, reason: str | None = None) -> RunStatus:
        """Applies a control action (TRANSITIONS); Conflict if the run's status does not allow it. A stop's
        `reason` is kept (RunInfo.reason); admission clears what the run waited for. Starting, waiting or
        admission stamps started_at (a waiting run's wait, then its training, is timed from it); it is active
        (active_runs) from its start or admission to its stop."""
    async def note_waiting(self, run_id: str, reason: str) -> None:
        """Sets what a waiting run waits for (RunInfo.reason, until its admission or stop); Conflict if it no
        longer waits."""
    async def global_blob(self, run_id: str) -> bytes: ...
    async def versioned_global(self, run_id: str) -> tuple[int, bytes]:
        """The current version and its global state, read together."""
    async def cloud_state_blob(self, run_id: str) -> bytes | None:
        """The algorithm's server memory (None before the first update)."""

    async def history(self, run_id: str) -> list[RoundRecord]:
        return await self.history_since(run_id, 0)

    async def history_since(self, run_id: str, start: int) -> list[RoundRecord]:
        """The run's history from record `start` on: a live view reads only what it has not seen."""
    async def fill_evaluation(self, run_id: str, record: RoundRecord) -> bool:
        """Replaces the history record of `record.round`, committed before its evaluation was in, by
        `record`; False if that record is evaluated already (its test_accuracy is not NaN), is of another
        version, or the run is gone."""
    async def delete_run(self, run_id: str) -> None:
        """Deletes everything of a run that is not active (created, waiting, stopped or finished); Conflict
        otherwise."""
    async def ended_runs(self) -> list[tuple[str, datetime]]:
        """The stopped and finished runs, each with when it ended, in creation order."""


class ContributionBuffer(Protocol):
    """Each run's buffer of accepted contributions, and the cloud update that consumes them."""

    async def submit(self, header: EdgeContributionHeader, blob: bytes, synchronous: bool,
                     members: Sequence[int] = ()) -> SubmitOutcome:
        """Buffers a contribution, atomically (see the module's docstring). Its idempotency key is looked up
        first: a retry with the same key for the same slot (edge, base version) is a duplicate (accepted,
        buffered once), even after its update consumed it, so the keys are kept as long as the run; the key used
        for another slot is a Conflict, key_reused. Then, in this order, Conflict with its reason: not_running
        (a run that does not exist too, detail "missing": a Conflict, not NotFound), future (base version newer
        than the run's), stale (`synchronous` and not the current version), conflict (the slot taken under
        another key), pending (the edge's previous contribution still waits). `members`: the devices it declares
        in a run where each is a member at one site, the edge whose accepted contribution declared it first:
        MembersElsewhere (a Conflict) naming those another edge holds; accepted, it holds those no edge held.
        The run's index of them is kept beside its buffer, so the check is O(members), whatever the history's
        length."""
    async def has_pending(self, run_id: str, edge_id: int) -> bool:
        """Whether the edge's last contribution is still in the buffer (it must wait for its update)."""
    async def buffered(self, run_id: str, count: int) -> list[BufferedContribution]:
        """The first `count` contributions waiting, oldest first, with their blobs."""
    async def buffered_headers(self, run_id: str) -> list[tuple[datetime, EdgeContributionHeader]]:
        """Every contribution waiting, with when it was accepted (the same instant as its entry's received_s:
        keep received_s to whole microseconds or coarser, so that the datetime holds it exactly): the headers
        only (a status view must not read every blob)."""
    async def commit_update(self, run_id: str, expected_version: int, consumed: list[BufferedContribution],
                            new_global: bytes, new_cloud_state: bytes, record: RoundRecord, finished: bool,
                            lease: Lease | None = None) -> bool:
        """Publishes version expected_version+1 atomically (see the module's docstring); False if another got
        there first, if the run was stopped meanwhile (a stopped run's model stays as it was), or if `lease`
        is given and no longer held (another replica may be computing this very update: only one of them
        may publish it). StateTooLarge if a blob is over what the storage holds."""


class EdgeRegistry(Protocol):
    async def register_edge(self, reg: EdgeRegistration) -> None: ...
    async def edge_known(self, edge_id: int) -> bool: ...
    async def registered_edges(self) -> set[int]: ...


class SiteRegistry(Protocol):
    """The sites (edges) that exist: each by its stable name, from its registrations, repeated as reports."""

    async def report_site(self, reg: EdgeRegistration) -> SiteInfo:
        """Records the edge's registration under its site name (first seen kept, last seen now; its devices and
        runs as this report says, replacing the last's); Conflict if another edge id holds that name. An edge
        that renamed itself leaves its old name."""
    async def sites(self) -> list[SiteInfo]:
        """Every site, by name."""
    async def remove_site(self, name: str) -> None:
        """Forgets the site `name` (NotFound if none): a site taken out of the federation. Its edge, if it reports
        again, is registered anew."""


def site_record(reg: EdgeRegistration, earlier: SiteInfo | None) -> SiteInfo:
    """What the registry keeps of a registration, `earlier` the record its name holds (Conflict: another edge's)."""
    name = reg.site_name
    if earlier is not None and earlier.edge_id != reg.edge_id:
        raise Conflict(f"site name {name!r} is edge {earlier.edge_id}'s, not edge {reg.edge_id}'s: give each edge "
                       "its own FL_EDGE_NAME", "site_name")
    at = now()
    return SiteInfo(name=name, edge_id=reg.edge_id, labels=reg.labels, url=reg.url,
                    registered_at=earlier.registered_at if earlier is not None else at, last_seen=at,
                    devices=reg.devices, serving=reg.serving, report_s=reg.report_s, states=reg.states,
                    device_page=reg.device_page, runs=reg.runs, label_sets=reg.label_sets,
                    mask_key=reg.mask_key)


class UpdateLeases(Protocol):
    """One lease per run: the replica holding it computes the run's next cloud update."""

    async def acquire_lease(self, run_id: str, ttl_s: float, holder: str) -> Lease | None:
        """The run's lease for `ttl_s`, or None while another holds it."""
    async def extend_lease(self, lease: Lease) -> None:
        """Holds the lease for another `ttl_s` from now; LeaseLost if it is no longer held."""
    async def release_lease(self, lease: Lease) -> None:
        """Gives the lease back; LeaseLost if it is no longer held (nothing to give back)."""


class Events(Protocol):
    """Tells every cloud process sharing the storage that something changed."""

    async def publish(self, message: str) -> None: ...
    async def listen(self, subscribed: Callable[[], Awaitable[None]], heard: Callable[[str], Awaitable[None]]) -> None:
        """Calls `subscribed()` once subscribed, then `heard(message)` for every message published, until
        cancelled or the connection fails (raised)."""


class AuditLog(Protocol):
    async def audit(self, record: AuditRecord, max_entries: int) -> None:
        """Appends a record; about the latest `max_entries` are kept, never fewer."""
    async def audit_log(self, limit: int) -> list[AuditRecord]:
        """The latest `limit` records, newest first."""


class RevokedTokens(Protocol):
    async def revoke_token(self, token_id: str) -> RevokedToken:
        """Revokes a device token by its id; revoking it again keeps the first record."""
    async def revoked_tokens(self) -> list[RevokedToken]:
        """Every revocation, oldest first."""


class Store(Runs, ContributionBuffer, EdgeRegistry, SiteRegistry, UpdateLeases, Events, AuditLog, RevokedTokens,
            Protocol):
    """Every interface of the storage: what a backend implements."""
