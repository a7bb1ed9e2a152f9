"""Runs in Redis: each run's meta hash, global state, cloud state and history list; the list of runs and the
set of the active ones (Redis-specific; every key in keys.py)."""
from __future__ import annotations

import functools
import math
from collections.abc import Callable
from datetime import datetime
from typing import TypeVar

from redis.asyncio.client import Pipeline
from redis.exceptions import WatchError

from fl_services.cloud.storage.ports import ENDED, Action, Conflict, NotFound, allowed, deletable, now
from fl_services.cloud.storage.redis.base import RedisBase, binary, optional_binary, text
from fl_services.cloud.storage.redis.keys import Entry, Meta
from fl_services.shared.core.config import RunConfig
from fl_services.shared.core.reports import RoundRecord, RunStatus
from fl_services.shared.wire.admin import RunInfo

T = TypeVar("T")


@functools.lru_cache(maxsize=64)
def parsed_config(raw: str) -> RunConfig:
    """A run's config from its stored JSON, parsed once per text: every update, poll and contribution reads
    it, and a RunConfig is frozen, so the same object serves them all."""
    return RunConfig.model_validate_json(raw)


class RedisRuns(RedisBase):
    async def ping(self) -> None:
        await self.r.ping()

    async def migrate(self) -> None:
        """A Redis written before several runs could be active names its one active run in a string key:
        that run joins the set."""
        legacy = await self.r.get(self.k.legacy_active)
        if legacy is not None:
            async with self.r.pipeline(transaction=True) as p:
                p.sadd(self.k.active, legacy)
                p.delete(self.k.legacy_active)
                await p.execute()

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
        return {text(k): text(v) for k, v in raw.items()}

    async def config(self, run_id: str) -> RunConfig:
        raw = await self.r.hget(self.k.meta(run_id), Meta.config)
        if raw is None:
            raise NotFound(f"unknown run {run_id!r}")
        return parsed_config(text(raw))

    async def status(self, run_id: str) -> tuple[RunStatus, int]:
        # Two fields, not the whole hash: the long-poll asks this of every active run at every announce.
        status, version = await self.r.hmget(self.k.meta(run_id), [Meta.status, Meta.version])
        if status is None or version is None:
            raise NotFound(f"unknown run {run_id!r}")
        return RunStatus(text(status)), int(text(version))

    async def info(self, run_id: str) -> RunInfo:
        async with self.r.pipeline(transaction=False) as p:  # one round trip
            p.hgetall(self.k.meta(run_id))
            p.lindex(self.k.history(run_id), -1)
            p.xlen(self.k.buffer(run_id))
            raw, last, buffered = await p.execute()
        if not raw:
            raise NotFound(f"unknown run {run_id!r}")
        meta = {text(k): text(v) for k, v in raw.items()}
        config = parsed_config(meta[Meta.config])
        return RunInfo(
            run_id=run_id,
            status=RunStatus(meta[Meta.status]),
            config=config,
            version=int(meta[Meta.version]),
            rounds=config.rounds,
            buffered=buffered,
            created_at=datetime.fromisoformat(meta[Meta.created_at]),
            started_at=datetime.fromisoformat(meta[Meta.started_at]) if Meta.started_at in meta else None,
            finished_at=datetime.fromisoformat(meta[Meta.finished_at]) if Meta.finished_at in meta else None,
            reason=meta.get(Meta.reason),
            last_round=RoundRecord.model_validate_json(last) if last else None,
        )

    async def run_ids(self) -> list[str]:
        return [text(x) for x in await self.r.lrange(self.k.runs, 0, -1)]

    async def active_runs(self) -> list[str]:
        return sorted(text(x) for x in await self.r.smembers(self.k.active))

    async def transition(self, run_id: str, action: Action, reason: str | None = None) -> RunStatus:
        def change(p: Pipeline, current: RunStatus) -> RunStatus:
            target = allowed(action, current)
            meta_key = self.k.meta(run_id)
            p.hset(meta_key, Meta.status, target.value)
            if action in ("start", "wait", "admit"):
                p.hset(meta_key, Meta.started_at, now().isoformat())
            if action in ("start", "admit"):
                p.sadd(self.k.active, run_id)
            if action == "admit":
                p.hdel(meta_key, Meta.reason)
            if action == "stop":
                p.hset(meta_key, Meta.finished_at, now().isoformat())
                if reason is None:  # an operator's stop: what a waiting run waited for no longer holds
                    p.hdel(meta_key, Meta.reason)
                else:
                    p.hset(meta_key, Meta.reason, reason)
                p.srem(self.k.active, run_id)
            return target

        return await self._change_run(run_id, change)

    async def note_waiting(self, run_id: str, reason: str) -> None:
        def note(p: Pipeline, current: RunStatus) -> None:
            if current != RunStatus.waiting:
                raise Conflict(f"run {run_id} is {current.value}, not waiting")
            p.hset(self.k.meta(run_id), Meta.reason, reason)

        await self._change_run(run_id, note)

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
                    outcome = change(p, RunStatus(text(status)))
                    await p.execute()
                    return outcome
                except WatchError:
                    continue

    async def global_blob(self, run_id: str) -> bytes:
        blob = optional_binary(await self.r.get(self.k.global_state(run_id)))
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
        return int(text(version)), binary(blob)

    async def cloud_state_blob(self, run_id: str) -> bytes | None:
        return optional_binary(await self.r.get(self.k.cloud_state(run_id)))

    async def history_since(self, run_id: str, start: int) -> list[RoundRecord]:
        await self._meta(run_id)
        return [RoundRecord.model_validate_json(x) for x in await self.r.lrange(self.k.history(run_id), start, -1)]

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

    async def delete_run(self, run_id: str) -> None:
        # The blobs of contributions left in its buffer (frozen: a run that is not active accepts none).
        blob_keys = [key for _, key in await self._entry_fields(run_id, Entry.blob_key)]
        files = await self._referenced_files(run_id)

        def change(p: Pipeline, current: RunStatus) -> None:
            deletable(current)
            p.delete(*self.k.run_keys(run_id), *blob_keys)
            p.lrem(self.k.runs, 0, run_id)

        await self._change_run(run_id, change)
        await self._delete_files(sorted(files))

    async def ended_runs(self) -> list[tuple[str, datetime]]:
        run_ids = await self.run_ids()
        async with self.r.pipeline(transaction=False) as p:
            for run_id in run_ids:
                p.hmget(self.k.meta(run_id), [Meta.status, Meta.finished_at])
            metas = await p.execute()
        ended = {status.value for status in ENDED}
        return [(run_id, datetime.fromisoformat(text(finished)))
                for run_id, (status, finished) in zip(run_ids, metas, strict=True)
                if status is not None and text(status) in ended and finished is not None]
