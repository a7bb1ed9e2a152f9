"""The cloud's state: runs, the global state, the contribution buffer and the history.

`Store` is what the routes and the orchestrator may ask of it; `RedisStore` keeps it in Redis (every key in
cloud/keys.py). Invariants that make a crash lose nothing and count nothing twice:
- a contribution is accepted by one Lua script that checks the idempotency key, the run's status and
  version, the edge's slot and that the edge has no contribution still waiting in the buffer, then
  appends to the buffer stream the header and the key of its blob; either all of that happens or none.
  The blob itself is SET just before, with a TTL: the script makes it permanent when it accepts the
  contribution and deletes it when it refuses it, and a cloud that dies in between leaves it to expire;
- an aggregation commits the new global state, the new version, the history record and the deletion
  of the consumed stream entries and their blobs in one MULTI/EXEC, guarded by WATCH on the run's meta hash.
  Until that EXEC the entries stay in the stream, so a cloud killed mid-aggregation redoes it.
"""
from __future__ import annotations

import asyncio
import json
import logging
import math
import secrets
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from string import Template
from typing import Any, Protocol, TypeVar
from urllib.parse import urlsplit

import redis
import redis.asyncio as aioredis
from redis.asyncio.client import Pipeline
from redis.asyncio.lock import Lock
from redis.exceptions import AuthenticationError, NoPermissionError, WatchError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from fl_services.cloud.keys import Entry, Keys, Meta
from fl_services.shared.core.config import RunConfig
from fl_services.shared.core.reports import EdgeContributionHeader, RoundRecord, RunStatus
from fl_services.shared.wire.admin import AuditRecord, RevokedToken, RunInfo
from fl_services.shared.wire.edge_cloud import EdgeRegistration

T = TypeVar("T")

log = logging.getLogger(__name__)


def now() -> datetime:
    return datetime.now(timezone.utc)


class RedisRefused(Exception):
    """Redis answers but will not let the cloud in (a wrong password or ACL user, a certificate it or the
    cloud refuses): retrying cannot help, so the cloud does not start."""


def check_redis(url: str, options: dict[str, Any]) -> None:
    """One PING before the cloud serves: RedisRefused if Redis refuses the cloud's credentials or TLS fails.
    Otherwise every request would answer 503 and the orchestrator log a traceback a second, for good. A Redis
    not reachable yet is no refusal: the cloud starts and waits for it, as for a restart."""
    parts = urlsplit(url)
    where = f"{parts.hostname}:{parts.port or 6379}"  # never the URL itself: it holds the password
    client = redis.Redis.from_url(url, socket_connect_timeout=5, socket_timeout=5, **options)
    try:
        client.ping()
    except (AuthenticationError, NoPermissionError) as exc:
        raise RedisRefused(f"Redis at {where} refused the cloud's credentials ({exc}): check the password or ACL "
                           "user in FL_CLOUD_REDIS_URL (redis://USER:PASSWORD@HOST:PORT/DB) or "
                           "FL_CLOUD_REDIS_PASSWORD") from None
    except RedisConnectionError as exc:
        tls_error = _ssl_error(exc)
        if tls_error is not None:
            raise RedisRefused(f"TLS with Redis at {where} failed ({tls_error}): check FL_CLOUD_REDIS_CA_FILE, "
                               "FL_CLOUD_REDIS_CERT_FILE and FL_CLOUD_REDIS_KEY_FILE") from None
        log.warning("Redis at %s is not reachable yet (%s); serving 503 until it is", where, exc)
    finally:
        client.close()


def _ssl_error(exc: BaseException) -> ssl.SSLError | None:
    """The TLS failure under a redis-py connection error, if that is what it was."""
    seen: BaseException | None = exc
    while seen is not None and not isinstance(seen, ssl.SSLError):
        seen = seen.__cause__ or seen.__context__
    return seen


class Conflict(Exception):
    """A request that is well-formed but not allowed in the run's current state (HTTP 409)."""

    def __init__(self, message: str, reason: str = "conflict"):
        super().__init__(message)
        self.reason = reason  # the refusal's name in the metrics (cloud/metrics.py)


class StateTooLarge(ValueError):
    """A cloud update whose result cannot be stored: the run cannot go on."""


# The storage cannot be reached (Redis down, restarting, or too slow): HTTP 503, which edges retry as they
# retry any 5xx, rather than a 500 with a traceback logged for every request (health checks included).
UNAVAILABLE: tuple[type[Exception], ...] = (RedisConnectionError, RedisTimeoutError)


class NotFound(Exception):
    """Unknown run or edge id (HTTP 404)."""


_SUBMIT = Template("""
-- KEYS: the run's meta hash, idempotency key -> entry id, slot (edge:version) -> idempotency key,
--       the buffer stream, edge -> its entry still in the buffer, the contribution's blob (SET just before)
local meta, idempotency, slots, buffer, pending, blob = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
-- ARGV: the submission's idempotency key, edge id, base version, header JSON, and
--       '1' if the algorithm is synchronous (a contribution must be on the current version)
local key, edge, base_version, header, synchronous = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]

local function refuse(outcome, detail)
  redis.call('DEL', blob)
  return {outcome, detail}
end
local slot = edge .. ':' .. base_version
local prev = redis.call('HGET', idempotency, key)
if prev then
  if redis.call('HGET', slots, slot) == key then return refuse('duplicate', prev) end
  return refuse('key_reused', prev)
end
local status = redis.call('HGET', meta, '$status')
if status ~= '$running' and status ~= '$paused' then return refuse('not_running', status or 'missing') end
local version = tonumber(redis.call('HGET', meta, '$version'))
local base = tonumber(base_version)
if base > version then return refuse('future', tostring(version)) end
if synchronous == '1' and base ~= version then return refuse('stale', tostring(version)) end
if redis.call('HEXISTS', slots, slot) == 1 then return refuse('conflict', tostring(version)) end
if redis.call('HEXISTS', pending, edge) == 1 then return refuse('pending', tostring(version)) end
if redis.call('PERSIST', blob) ~= 1 then return {'lost', blob} end
local id = redis.call('XADD', buffer, '*', '$blob_key', blob, '$header', header)
redis.call('HSET', idempotency, key, id)
redis.call('HSET', slots, slot, key)
redis.call('HSET', pending, edge, id)
return {'accepted', id}
""").substitute(status=Meta.status, version=Meta.version, blob_key=Entry.blob_key, header=Entry.header,
               running=RunStatus.running.value, paused=RunStatus.paused.value)
# How long a contribution's blob outlives a submit that never ran its script (the cloud died in between).
_STAGED_MS = 3_600_000


@dataclass(frozen=True)
class BufferedContribution:
    entry_id: bytes
    header: EdgeContributionHeader
    blob: bytes
    blob_key: bytes | None = None  # where the blob is kept (None: inline in the entry, as written before)

    @property
    def received_s(self) -> float:
        """When the buffer accepted it, in Redis's clock (seconds since the epoch)."""
        return _stream_seconds(self.entry_id)


def _stream_seconds(entry_id: bytes) -> float:
    """A stream entry id's milliseconds (the Redis server's clock when it was added), as seconds."""
    return int(entry_id.split(b"-")[0]) / 1000


@dataclass(frozen=True)
class SubmitOutcome:
    accepted: bool
    duplicate: bool
    buffered: int


# Which transitions each control action allows.
_TRANSITIONS = {
    "start": ({RunStatus.created}, RunStatus.running),
    "pause": ({RunStatus.running}, RunStatus.paused),
    "resume": ({RunStatus.paused}, RunStatus.running),
    "stop": ({RunStatus.created, RunStatus.running, RunStatus.paused}, RunStatus.stopped),
}


# Redis's default proto-max-bulk-len: no single value may be larger.
_REDIS_MAX_VALUE = 512 * 2**20
# The statuses in which a computed cloud update may still be published.
_UPDATABLE = {RunStatus.running.value, RunStatus.paused.value}


class Store(Protocol):
    """The cloud's state as the routes and the orchestrator see it (RedisStore keeps it in Redis)."""

    def new_run_id(self) -> str: ...
    async def ping(self) -> None:
        """Raises if the storage cannot be reached (the health route's check)."""
    async def create_run(self, run_id: str, config: RunConfig, initial_global: bytes) -> None: ...
    async def config(self, run_id: str) -> RunConfig: ...
    async def status(self, run_id: str) -> tuple[RunStatus, int]: ...
    async def info(self, run_id: str) -> RunInfo: ...
    async def infos(self, run_ids: list[str]) -> list[RunInfo]:
        """The runs' infos, leaving out those deleted meanwhile."""
    async def run_ids(self) -> list[str]: ...
    async def active_runs(self) -> list[str]:
        """The runs that are running or paused, sorted by id (a stable order for every replica)."""
    async def migrate(self) -> None:
        """Brings keys written by an older version to today's layout (idempotent)."""
    async def transition(self, run_id: str, action: str) -> RunStatus: ...
    async def global_blob(self, run_id: str) -> bytes: ...
    async def versioned_global(self, run_id: str) -> tuple[int, bytes]:
        """The current version and its global state, read together."""
    async def cloud_state_blob(self, run_id: str) -> bytes | None: ...
    async def history(self, run_id: str) -> list[RoundRecord]: ...
    async def register_edge(self, reg: EdgeRegistration) -> None: ...
    async def edge_known(self, edge_id: int) -> bool: ...
    async def submit(self, header: EdgeContributionHeader, blob: bytes, synchronous: bool) -> SubmitOutcome: ...
    async def has_pending(self, run_id: str, edge_id: int) -> bool: ...
    async def buffered(self, run_id: str, count: int) -> list[BufferedContribution]: ...
    async def commit_update(self, run_id: str, expected_version: int, consumed: list[BufferedContribution],
                            new_global: bytes, new_cloud_state: bytes, record: RoundRecord, finished: bool,
                            lease_token: str | None = None) -> bool: ...
    async def fill_evaluation(self, run_id: str, record: RoundRecord) -> bool:
        """Replaces the history record of `record.round`, committed before its evaluation was in, by
        `record`; False if that record is evaluated already (or the run is gone)."""
    def lease(self, run_id: str, ttl_s: float) -> Lock:
        """The run's update lease (see RedisStore.lease)."""
        ...
    async def publish(self, message: str) -> None:
        """Tells every replica sharing this Redis that something changed (see `listen`)."""
    async def listen(self, subscribed: Callable[[], Awaitable[None]], heard: Callable[[str], Awaitable[None]]) -> None:
        """Calls `subscribed()` once subscribed, then `heard(message)` for every message published, until
        cancelled or the connection fails (raised)."""
    # What the dashboard reads.
    async def history_since(self, run_id: str, start: int) -> list[RoundRecord]: ...
    async def buffered_headers(self, run_id: str) -> list[tuple[datetime, EdgeContributionHeader]]: ...
    async def registered_edges(self) -> set[int]: ...
    # Operations: deletion, retention, the audit log and revoked device tokens.
    async def delete_run(self, run_id: str) -> None: ...
    async def ended_runs(self) -> list[tuple[str, datetime]]: ...
    async def audit(self, record: AuditRecord, max_entries: int) -> None: ...
    async def audit_log(self, limit: int) -> list[AuditRecord]: ...
    async def revoke_token(self, token_id: str) -> RevokedToken: ...
    async def revoked_tokens(self) -> list[RevokedToken]: ...


class RedisStore(Store):
    def __init__(self, redis: aioredis.Redis, keys: Keys, bulk: redis.Redis | None = None):
        self.r = redis
        self.k = keys
        # A blocking client for the contributions' blobs, used on a worker thread: it hands a 60 MB value to
        # the socket as it is, where the asyncio client's transport first copies it into its buffer twice and
        # then writes it one event-loop turn at a time (a SET of 60 MB took 0.3-0.4 s longer here). None:
        # the asyncio client does it all.
        self.bulk = bulk
        self._submit = redis.register_script(_SUBMIT)

    # ---- runs ----------------------------------------------------------------------------------
    @staticmethod
    def new_run_id() -> str:
        return secrets.token_hex(6)

    async def ping(self) -> None:
        await self.r.ping()

    async def create_run(self, run_id: str, config: RunConfig, initial_global: bytes) -> None:
        async with self.r.pipeline(transaction=True) as p:
            p.hset(self.k.meta(run_id), mapping={
                Meta.config: config.model_dump_json(),
                Meta.status: RunStatus.created.value,
                Meta.version: 0,
                Meta.created_at: now().isoformat(),
            })
            p.set(self.k.global_state(run_id), initial_global)
            p.rpush(self.k.runs, run_id)
            await p.execute()

    async def _meta(self, run_id: str) -> dict[str, str]:
        raw = await self.r.hgetall(self.k.meta(run_id))
        if not raw:
            raise NotFound(f"unknown run {run_id!r}")
        return {_text(k): _text(v) for k, v in raw.items()}

    async def config(self, run_id: str) -> RunConfig:
        return RunConfig.model_validate_json((await self._meta(run_id))[Meta.config])

    async def status(self, run_id: str) -> tuple[RunStatus, int]:
        meta = await self._meta(run_id)
        return RunStatus(meta[Meta.status]), int(meta[Meta.version])

    async def info(self, run_id: str) -> RunInfo:
        meta = await self._meta(run_id)
        config = RunConfig.model_validate_json(meta[Meta.config])
        last = await self.r.lindex(self.k.history(run_id), -1)
        return RunInfo(
            run_id=run_id,
            status=RunStatus(meta[Meta.status]),
            config=config,
            version=int(meta[Meta.version]),
            rounds=config.rounds,
            buffered=await self.r.xlen(self.k.buffer(run_id)),
            created_at=datetime.fromisoformat(meta[Meta.created_at]),
            started_at=datetime.fromisoformat(meta[Meta.started_at]) if Meta.started_at in meta else None,
            finished_at=datetime.fromisoformat(meta[Meta.finished_at]) if Meta.finished_at in meta else None,
            last_round=RoundRecord.model_validate_json(last) if last else None,
        )

    async def infos(self, run_ids: list[str]) -> list[RunInfo]:
        # One by one: a run deleted between the listing of ids and its read (another admin, retention) made
        # the whole list of runs answer 404 "unknown run" (138 of 148 lists while three callers deleted runs).
        infos = []
        for run_id in run_ids:
            try:
                infos.append(await self.info(run_id))
            except NotFound:
                continue
        return infos

    async def run_ids(self) -> list[str]:
        return [_text(x) for x in await self.r.lrange(self.k.runs, 0, -1)]

    async def active_runs(self) -> list[str]:
        return sorted(_text(x) for x in await self.r.smembers(self.k.active))

    async def migrate(self) -> None:
        """A Redis written before several runs could be active names its one active run in a string key:
        that run joins the set (idempotent; every replica may do it at start)."""
        legacy = await self.r.get(self.k.legacy_active)
        if legacy is not None:
            async with self.r.pipeline(transaction=True) as p:
                p.sadd(self.k.active, legacy)
                p.delete(self.k.legacy_active)
                await p.execute()

    async def transition(self, run_id: str, action: str) -> RunStatus:
        allowed, target = _TRANSITIONS[action]

        def change(p: Pipeline, current: RunStatus) -> RunStatus:
            if current not in allowed:
                raise Conflict(f"cannot {action} a run that is {current.value}")
            meta_key = self.k.meta(run_id)
            p.hset(meta_key, Meta.status, target.value)
            if action == "start":
                p.hset(meta_key, Meta.started_at, now().isoformat())
                p.sadd(self.k.active, run_id)
            if action == "stop":
                p.hset(meta_key, Meta.finished_at, now().isoformat())
                p.srem(self.k.active, run_id)
            return target

        return await self._change_run(run_id, change)

    async def _change_run(self, run_id: str, change: Callable[[Pipeline, RunStatus], T]) -> T:
        """`change(pipeline, the run's status)` queues a change of the run in one MULTI/EXEC (or raises to
        refuse it), under WATCH on the run's meta hash: redone if it changed meanwhile. NotFound for an unknown run."""
        meta_key = self.k.meta(run_id)
        async with self.r.pipeline(transaction=True) as p:
            while True:
                try:
                    await p.watch(meta_key)
                    status = await p.hget(meta_key, Meta.status)
                    if status is None:
                        raise NotFound(f"unknown run {run_id!r}")
                    p.multi()
                    outcome = change(p, RunStatus(_text(status)))
                    await p.execute()
                    return outcome
                except WatchError:
                    continue

    async def global_blob(self, run_id: str) -> bytes:
        blob = _blob(await self.r.get(self.k.global_state(run_id)))
        if blob is None:
            raise NotFound(f"unknown run {run_id!r}")
        return blob

    async def versioned_global(self, run_id: str) -> tuple[int, bytes]:
        async with self.r.pipeline(transaction=True) as p:  # MULTI: both from one moment
            p.hget(self.k.meta(run_id), Meta.version)
            p.get(self.k.global_state(run_id))
            version, blob = await p.execute()
        if version is None or blob is None:
            raise NotFound(f"unknown run {run_id!r}")
        return int(_text(version)), _bytes(blob)

    async def cloud_state_blob(self, run_id: str) -> bytes | None:
        return _blob(await self.r.get(self.k.cloud_state(run_id)))

    async def history(self, run_id: str) -> list[RoundRecord]:
        await self._meta(run_id)
        return [RoundRecord.model_validate_json(x) for x in await self.r.lrange(self.k.history(run_id), 0, -1)]

    # ---- edges ---------------------------------------------------------------------------------
    async def register_edge(self, reg: EdgeRegistration) -> None:
        record = {"edge_id": reg.edge_id, "url": reg.url, "registered_at": now().isoformat()}
        await self.r.hset(self.k.edges, str(reg.edge_id), json.dumps(record))

    async def edge_known(self, edge_id: int) -> bool:
        return bool(await self.r.hexists(self.k.edges, str(edge_id)))

    # ---- buffer --------------------------------------------------------------------------------
    async def submit(self, header: EdgeContributionHeader, blob: bytes, synchronous: bool) -> SubmitOutcome:
        # The blob goes in by a plain SET, the cheapest write of its bytes (and of their append to the AOF),
        # not as an argument of the script: Lua would copy it twice more, and a script's effects are written
        # to the AOF as one more command carrying it. The script then keeps it (or deletes it) atomically.
        staged = self.k.contribution(header.run_id, secrets.token_hex(12))
        if self.bulk is None:
            await self.r.set(staged, blob, px=_STAGED_MS)
        else:
            await asyncio.to_thread(self.bulk.set, staged, blob, px=_STAGED_MS)
        outcome, detail = await self._submit(  # in the order the script's header names them
            keys=[self.k.meta(header.run_id), self.k.idempotency(header.run_id), self.k.slots(header.run_id),
                  self.k.buffer(header.run_id), self.k.pending(header.run_id), staged],
            args=[header.idempotency_key, header.edge_id, header.base_version,
                  header.model_dump_json(), "1" if synchronous else "0"],
        )
        outcome, detail = outcome.decode(), detail.decode()
        if outcome == "lost":  # its TTL ran out before the script ran: nothing was accepted
            raise RedisTimeoutError(f"the contribution's blob {detail} expired before it could be buffered")
        buffered = await self.r.xlen(self.k.buffer(header.run_id))
        if outcome == "accepted":
            return SubmitOutcome(True, False, buffered)
        if outcome == "duplicate":
            return SubmitOutcome(True, True, buffered)
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
        raise Conflict(messages[outcome], outcome)

    async def has_pending(self, run_id: str, edge_id: int) -> bool:
        """Whether the edge's last contribution is still in the buffer (it must wait for its update)."""
        return bool(await self.r.hexists(self.k.pending(run_id), str(edge_id)))

    async def buffered(self, run_id: str, count: int) -> list[BufferedContribution]:
        entries = await self.r.xrange(self.k.buffer(run_id), count=count)
        keys = [_field(fields, Entry.blob_key) for _, fields in entries or []]
        stored = [k for k in keys if k is not None]
        blobs = [] if not stored else (await self.r.mget(stored) if self.bulk is None
                                       else await asyncio.to_thread(self.bulk.mget, stored))
        found = iter(blobs)
        return [_buffered(entry_id, fields, next(found) if key is not None else None)
                for (entry_id, fields), key in zip(entries or [], keys, strict=True)]

    async def commit_update(
        self,
        run_id: str,
        expected_version: int,
        consumed: list[BufferedContribution],
        new_global: bytes,
        new_cloud_state: bytes,
        record: RoundRecord,
        finished: bool,
        lease_token: str | None = None,
    ) -> bool:
        """Publishes version expected_version+1 atomically; False if someone else got there first, if the
        run was stopped while the update was computed (a stopped run's model stays as it was), or if
        `lease_token` is given and no longer holds the run's lease (it expired and another replica may be
        computing this very update: only one of them may publish it)."""
        for what, blob in (("global state", new_global), ("cloud state", new_cloud_state)):
            if len(blob) > _REDIS_MAX_VALUE:
                # Redis would drop the connection, which redis-py reports as a WatchError inside a
                # transaction: the update would be recomputed forever without a word.
                raise StateTooLarge(f"run {run_id}: the new {what} takes {len(blob) / 2**20:.0f} MiB, "
                                    f"over the {_REDIS_MAX_VALUE // 2**20} MiB a Redis value can hold")
        meta_key = self.k.meta(run_id)
        async with self.r.pipeline(transaction=True) as p:
            try:
                await p.watch(meta_key, self.k.lease(run_id))
                version, status = await p.hmget(meta_key, [Meta.version, Meta.status])
                if (version is None or status is None or int(_text(version)) != expected_version
                        or _text(status) not in _UPDATABLE):
                    return False
                if lease_token is not None and await p.get(self.k.lease(run_id)) != lease_token.encode():
                    return False
                p.multi()
                p.set(self.k.global_state(run_id), new_global)
                p.set(self.k.cloud_state(run_id), new_cloud_state)
                p.hset(meta_key, Meta.version, expected_version + 1)
                p.rpush(self.k.history(run_id), record.model_dump_json())
                p.xdel(self.k.buffer(run_id), *[c.entry_id for c in consumed])
                blob_keys = [c.blob_key for c in consumed if c.blob_key is not None]
                if blob_keys:
                    p.delete(*blob_keys)
                p.hdel(self.k.pending(run_id), *[str(c.header.edge_id) for c in consumed])
                if finished:
                    p.hset(meta_key, mapping={Meta.status: RunStatus.finished.value,
                                              Meta.finished_at: now().isoformat()})
                    p.srem(self.k.active, run_id)
                await p.execute()
                return True
            except WatchError:
                return False

    async def fill_evaluation(self, run_id: str, record: RoundRecord) -> bool:
        key = self.k.history(run_id)
        async with self.r.pipeline(transaction=True) as p:
            try:
                await p.watch(key)
                stored = await p.lindex(key, record.round)
                if stored is None:
                    return False
                previous = RoundRecord.model_validate_json(stored)
                if previous.version != record.version or not math.isnan(previous.test_accuracy):
                    return False
                p.multi()
                p.lset(key, record.round, record.model_dump_json())
                await p.execute()
                return True
            except WatchError:  # another replica filled it in (with the same figures) meanwhile
                return False

    # ---- several replicas ----------------------------------------------------------------------
    def lease(self, run_id: str, ttl_s: float) -> Lock:
        """The lease on the run's next cloud update, redis-py's Lock: SET NX PX with a token to take it,
        Lua compare-and-set of its TTL to renew it, Lua compare-and-delete to release it (arq's pattern)."""
        return self.r.lock(self.k.lease(run_id), timeout=ttl_s, blocking=False, thread_local=False)

    async def publish(self, message: str) -> None:
        await self.r.publish(self.k.events, message)

    async def listen(self, subscribed: Callable[[], Awaitable[None]], heard: Callable[[str], Awaitable[None]]) -> None:
        # One connection for the whole process, whatever the number of waiters it wakes; its own, outside the
        # bounded pool, so that requests holding every pooled connection can never keep the wake-ups waiting.
        pool = self.r.connection_pool
        own = aioredis.ConnectionPool(connection_class=pool.connection_class, max_connections=1,
                                      **pool.connection_kwargs)
        try:
            async with aioredis.Redis(connection_pool=own).pubsub(ignore_subscribe_messages=True) as pubsub:
                await pubsub.subscribe(self.k.events)
                await subscribed()
                async for message in pubsub.listen():
                    if message.get("type") == "message":
                        await heard(_text(message["data"]))
        finally:
            await own.disconnect()

    # ---- dashboard reads -----------------------------------------------------------------------
    async def history_since(self, run_id: str, start: int) -> list[RoundRecord]:
        """The run's history from record `start` on: a live view reads only what it has not seen."""
        await self._meta(run_id)
        return [RoundRecord.model_validate_json(x) for x in await self.r.lrange(self.k.history(run_id), start, -1)]

    async def buffered_headers(self, run_id: str) -> list[tuple[datetime, EdgeContributionHeader]]:
        """The contributions waiting in the buffer, each with when it was accepted (its stream id's
        milliseconds). The headers only: a status view must not pull every blob out of Redis."""
        entries = await self.r.eval(_HEADERS, 1, self.k.buffer(run_id), Entry.header.value)
        return [(datetime.fromtimestamp(_stream_seconds(entries[i]), timezone.utc),
                 EdgeContributionHeader.model_validate_json(entries[i + 1])) for i in range(0, len(entries), 2)]

    async def registered_edges(self) -> set[int]:
        return {int(edge_id) for edge_id in await self.r.hkeys(self.k.edges)}


    # ---- operations ----------------------------------------------------------------------------
    async def delete_run(self, run_id: str) -> None:
        """Deletes every key of a run that is not active (created, stopped or finished): 409 otherwise."""
        # The blobs of contributions left in its buffer (frozen: a run that is not active accepts none).
        blob_keys = await self.r.eval(_BLOB_KEYS, 1, self.k.buffer(run_id), Entry.blob_key.value)

        def change(p: Pipeline, current: RunStatus) -> None:
            if current in (RunStatus.running, RunStatus.paused):
                raise Conflict(f"cannot delete a run that is {current.value}; stop it first")
            p.delete(*self.k.run_keys(run_id), *blob_keys)
            p.lrem(self.k.runs, 0, run_id)

        await self._change_run(run_id, change)

    async def ended_runs(self) -> list[tuple[str, datetime]]:
        """The stopped and finished runs, each with when it ended, in creation order."""
        run_ids = await self.run_ids()
        async with self.r.pipeline(transaction=False) as p:
            for run_id in run_ids:
                p.hmget(self.k.meta(run_id), [Meta.status, Meta.finished_at])
            metas = await p.execute()
        ended = {RunStatus.stopped.value, RunStatus.finished.value}
        return [(run_id, datetime.fromisoformat(_text(finished)))
                for run_id, (status, finished) in zip(run_ids, metas, strict=True)
                if status is not None and _text(status) in ended and finished is not None]

    async def audit(self, record: AuditRecord, max_entries: int) -> None:
        # Trimmed as Redis finds cheapest (whole nodes): about max_entries are kept, never fewer.
        await self.r.xadd(self.k.audit, {"record": record.model_dump_json()}, maxlen=max_entries, approximate=True)

    async def audit_log(self, limit: int) -> list[AuditRecord]:
        """The latest `limit` records, newest first."""
        entries = await self.r.xrevrange(self.k.audit, count=limit)
        return [AuditRecord.model_validate_json(fields[b"record"]) for _, fields in entries or [] if fields]

    async def revoke_token(self, token_id: str) -> RevokedToken:
        """Revokes a device token by its id; revoking it again keeps the first record."""
        record = RevokedToken(token_id=token_id, revoked_at=now())
        await self.r.hsetnx(self.k.revoked_tokens, token_id, record.model_dump_json())
        kept = await self.r.hget(self.k.revoked_tokens, token_id)
        return RevokedToken.model_validate_json(kept) if kept is not None else record

    async def revoked_tokens(self) -> list[RevokedToken]:
        records = [RevokedToken.model_validate_json(v) for v in (await self.r.hgetall(self.k.revoked_tokens)).values()]
        return sorted(records, key=lambda r: r.revoked_at)


# Every stream entry's id and its header field, in stream order: {id1, header1, id2, header2, ...}.
_HEADERS = """
local out = {}
for _, entry in ipairs(redis.call('XRANGE', KEYS[1], '-', '+')) do
  local fields = entry[2]
  for i = 1, #fields, 2 do
    if fields[i] == ARGV[1] then out[#out + 1] = entry[1]; out[#out + 1] = fields[i + 1] end
  end
end
return out
"""

# Every stream entry's blob key (entries written before blob keys hold their blob inline: none).
_BLOB_KEYS = """
local out = {}
for _, entry in ipairs(redis.call('XRANGE', KEYS[1], '-', '+')) do
  local fields = entry[2]
  for i = 1, #fields, 2 do
    if fields[i] == ARGV[1] then out[#out + 1] = fields[i + 1] end
  end
end
return out
"""

# redis-py types every reply as bytes | str (str under decode_responses=True); this store's client is made
# without it, so its replies are bytes. These say so once instead of at every call.
def _text(reply: bytes | str) -> str:
    return reply.decode() if isinstance(reply, bytes) else reply


def _bytes(reply: bytes | str) -> bytes:
    if isinstance(reply, str):
        raise TypeError("the store's Redis client must not decode responses: its values are binary")
    return reply


def _blob(reply: bytes | str | None) -> bytes | None:
    return None if reply is None else _bytes(reply)


def _field(fields: dict[bytes | str, bytes | str] | None, name: Entry) -> bytes | None:
    value = (fields or {}).get(name.encode())
    return None if value is None else _bytes(value)


def _buffered(entry_id: bytes | str | None, fields: dict[bytes | str, bytes | str] | None,
              stored: bytes | str | None) -> BufferedContribution:
    """A buffer entry with its blob: `stored` under its blob key, or inline (written before blob keys)."""
    if not isinstance(entry_id, bytes) or fields is None:  # XRANGE gives neither (only XCLAIM's deleted entries)
        raise TypeError(f"unexpected stream entry {entry_id!r} in the contribution buffer")
    header = EdgeContributionHeader.model_validate_json(fields[Entry.header.encode()])
    key = _field(fields, Entry.blob_key)
    blob = _field(fields, Entry.blob) if key is None else _blob(stored)
    if blob is None:
        raise LookupError(f"the blob {key!r} of buffer entry {entry_id!r} is missing")
    return BufferedContribution(entry_id, header, blob, key)
