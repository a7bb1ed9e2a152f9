"""The cloud's state in Redis: runs, the global state, the contribution buffer and the history.

Invariants that make a crash lose nothing and count nothing twice:
- a contribution is accepted by one Lua script that checks the idempotency key, the run's status and
  version, the edge's slot and that the edge has no contribution still waiting in the buffer, then
  appends to the buffer stream; either all of that happens or none;
- an aggregation commits the new global state, the new version, the history record and the deletion
  of the consumed stream entries in one MULTI/EXEC, guarded by WATCH on the run's meta hash.
  Until that EXEC the entries stay in the stream, so a cloud killed mid-aggregation redoes it.
"""
from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from datetime import datetime, timezone
from string import Template

import redis.asyncio as aioredis
from redis.exceptions import WatchError

from cloud.keys import Entry, Keys, Meta
from shared.config import RunConfig
from shared.schemas import EdgeContributionHeader, EdgeRegistration, RoundRecord, RunInfo, RunStatus


def now() -> datetime:
    return datetime.now(timezone.utc)


class Conflict(Exception):
    """A request that is well-formed but not allowed in the run's current state (HTTP 409)."""

    def __init__(self, message: str, reason: str = "conflict"):
        super().__init__(message)
        self.reason = reason  # the refusal's name in the metrics (cloud/metrics.py)


class StateTooLarge(ValueError):
    """A cloud update whose result cannot be stored: the run cannot go on."""


class NotFound(Exception):
    """Unknown run or edge id (HTTP 404)."""


_SUBMIT = Template("""
local slot = ARGV[2] .. ':' .. ARGV[3]
local prev = redis.call('HGET', KEYS[2], ARGV[1])
if prev then
  if redis.call('HGET', KEYS[3], slot) == ARGV[1] then return {'duplicate', prev} end
  return {'key_reused', prev}
end
local status = redis.call('HGET', KEYS[1], '$status')
if status ~= '$running' and status ~= '$paused' then return {'not_running', status or 'missing'} end
local version = tonumber(redis.call('HGET', KEYS[1], '$version'))
local base = tonumber(ARGV[3])
if base > version then return {'future', tostring(version)} end
if ARGV[6] == '1' and base ~= version then return {'stale', tostring(version)} end
if redis.call('HEXISTS', KEYS[3], slot) == 1 then return {'conflict', tostring(version)} end
if redis.call('HEXISTS', KEYS[5], ARGV[2]) == 1 then return {'pending', tostring(version)} end
local id = redis.call('XADD', KEYS[4], '*', '$blob', ARGV[5], '$header', ARGV[4])
redis.call('HSET', KEYS[2], ARGV[1], id)
redis.call('HSET', KEYS[3], slot, ARGV[1])
redis.call('HSET', KEYS[5], ARGV[2], id)
return {'accepted', id}
""").substitute(status=Meta.status, version=Meta.version, blob=Entry.blob, header=Entry.header,
               running=RunStatus.running.value, paused=RunStatus.paused.value)


@dataclass(frozen=True)
class BufferedContribution:
    entry_id: bytes
    header: EdgeContributionHeader
    blob: bytes


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


class Store:
    def __init__(self, redis: aioredis.Redis, keys: Keys):
        self.r = redis
        self.k = keys
        self._submit = redis.register_script(_SUBMIT)

    # ---- runs ----------------------------------------------------------------------------------
    @staticmethod
    def new_run_id() -> str:
        return secrets.token_hex(6)

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
        return {k.decode(): v.decode() for k, v in raw.items()}

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

    async def run_ids(self) -> list[str]:
        return [x.decode() for x in await self.r.lrange(self.k.runs, 0, -1)]

    async def active_run(self) -> str | None:
        value = await self.r.get(self.k.active)
        return value.decode() if value else None

    async def transition(self, run_id: str, action: str) -> RunStatus:
        allowed, target = _TRANSITIONS[action]
        meta_key = self.k.meta(run_id)
        async with self.r.pipeline(transaction=True) as p:
            while True:
                try:
                    await p.watch(meta_key, self.k.active)
                    status = await p.hget(meta_key, Meta.status)
                    if status is None:
                        raise NotFound(f"unknown run {run_id!r}")
                    current = RunStatus(status.decode())
                    if current not in allowed:
                        raise Conflict(f"cannot {action} a run that is {current.value}")
                    active = await p.get(self.k.active)
                    if action == "start" and active is not None and active.decode() != run_id:
                        raise Conflict(f"run {active.decode()} is already active; stop it first")
                    p.multi()
                    p.hset(meta_key, Meta.status, target.value)
                    if action == "start":
                        p.hset(meta_key, Meta.started_at, now().isoformat())
                        p.set(self.k.active, run_id)
                    if action == "stop":
                        p.hset(meta_key, Meta.finished_at, now().isoformat())
                        if active is not None and active.decode() == run_id:
                            p.delete(self.k.active)
                    await p.execute()
                    return target
                except WatchError:
                    continue

    async def global_blob(self, run_id: str) -> bytes:
        blob = await self.r.get(self.k.global_state(run_id))
        if blob is None:
            raise NotFound(f"unknown run {run_id!r}")
        return blob

    async def cloud_state_blob(self, run_id: str) -> bytes | None:
        return await self.r.get(self.k.cloud_state(run_id))

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
        outcome, detail = await self._submit(
            keys=[self.k.meta(header.run_id), self.k.idempotency(header.run_id),
                  self.k.slots(header.run_id), self.k.buffer(header.run_id), self.k.pending(header.run_id)],
            args=[header.idempotency_key, header.edge_id, header.base_version,
                  header.model_dump_json(), blob, "1" if synchronous else "0"],
        )
        outcome, detail = outcome.decode(), detail.decode()
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
        return [
            BufferedContribution(
                entry_id, EdgeContributionHeader.model_validate_json(fields[Entry.header.encode()]),
                fields[Entry.blob.encode()],
            )
            for entry_id, fields in entries
        ]

    async def commit_update(
        self,
        run_id: str,
        expected_version: int,
        consumed: list[BufferedContribution],
        new_global: bytes,
        new_cloud_state: bytes,
        record: RoundRecord,
        finished: bool,
    ) -> bool:
        """Publishes version expected_version+1 atomically; False if someone else got there first, or
        if the run was stopped while the update was computed (a stopped run's model stays as it was)."""
        for what, blob in (("global state", new_global), ("cloud state", new_cloud_state)):
            if len(blob) > _REDIS_MAX_VALUE:
                # Redis would drop the connection, which redis-py reports as a WatchError inside a
                # transaction: the update would be recomputed forever without a word.
                raise StateTooLarge(f"run {run_id}: the new {what} takes {len(blob) / 2**20:.0f} MiB, "
                                    f"over the {_REDIS_MAX_VALUE // 2**20} MiB a Redis value can hold")
        meta_key = self.k.meta(run_id)
        async with self.r.pipeline(transaction=True) as p:
            try:
                await p.watch(meta_key, self.k.active)
                version, status = await p.hmget(meta_key, [Meta.version, Meta.status])
                if int(version) != expected_version or status.decode() not in _UPDATABLE:
                    return False
                active = await p.get(self.k.active)
                p.multi()
                p.set(self.k.global_state(run_id), new_global)
                p.set(self.k.cloud_state(run_id), new_cloud_state)
                p.hset(meta_key, Meta.version, expected_version + 1)
                p.rpush(self.k.history(run_id), record.model_dump_json())
                p.xdel(self.k.buffer(run_id), *[c.entry_id for c in consumed])
                p.hdel(self.k.pending(run_id), *[str(c.header.edge_id) for c in consumed])
                if finished:
                    p.hset(meta_key, mapping={Meta.status: RunStatus.finished.value,
                                              Meta.finished_at: now().isoformat()})
                    if active is not None and active.decode() == run_id:  # never another run's
                        p.delete(self.k.active)
                await p.execute()
                return True
            except WatchError:
                return False
