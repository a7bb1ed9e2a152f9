"""Each run's contribution buffer in Redis, and the cloud update that consumes it (Redis-specific).

- A contribution is accepted by one Lua script (submit.lua) that checks the idempotency key, the run's status
  and version, the edge's slot and that the edge has no contribution still waiting in the buffer, then
  appends to the buffer stream the header and the key of its blob; either all of that happens or none.
  The blob itself is SET just before, with a TTL: the script makes it permanent when it accepts the
  contribution and deletes it when it refuses it, and a cloud that dies in between leaves it to expire.
- An update commits the new global state, the new version, the history record and the deletion of the
  consumed stream entries and their blobs in one MULTI/EXEC, guarded by WATCH on the run's meta hash and its
  lease (the fencing of a lease that expired meanwhile).
"""
from __future__ import annotations

import asyncio
import secrets
from collections.abc import Sequence
from datetime import datetime, timezone

from redis.exceptions import WatchError

from fl_services.cloud.storage.ports import (
    UPDATABLE,
    BufferedContribution,
    Lease,
    StorageUnavailable,
    SubmitOutcome,
    check_state_sizes,
    now,
    refusal,
)
from fl_services.cloud.storage.redis.base import RedisBase, binary, optional_binary, text
from fl_services.cloud.storage.redis.keys import Entry, Meta
from fl_services.shared.core.reports import EdgeContributionHeader, RoundRecord, RunStatus

# How long a contribution's blob outlives a submit that never ran its script (the cloud died in between).
STAGED_MS = 3_600_000
_UPDATABLE = {status.value for status in UPDATABLE}


class RedisBuffer(RedisBase):
    async def submit(self, header: EdgeContributionHeader, blob: bytes, synchronous: bool,
                     members: Sequence[int] = ()) -> SubmitOutcome:
        # The blob goes in by a plain SET, the cheapest write of its bytes (and of their append to the AOF),
        # not as an argument of the script: Lua would copy it twice more, and a script's effects are written
        # to the AOF as one more command carrying it. The script then keeps it (or deletes it) atomically.
        staged = self.k.contribution(header.run_id, secrets.token_hex(12))
        if self.bulk is None:
            await self.r.set(staged, blob, px=STAGED_MS)
        else:
            await asyncio.to_thread(self.bulk.set, staged, blob, px=STAGED_MS)
        outcome, detail = await self.scripts.submit(  # in the order the script's header names them
            keys=[self.k.meta(header.run_id), self.k.idempotency(header.run_id), self.k.slots(header.run_id),
                  self.k.buffer(header.run_id), self.k.pending(header.run_id), staged,
                  self.k.member_sites(header.run_id)],
            args=[header.idempotency_key, header.edge_id, header.base_version,
                  header.model_dump_json(), "1" if synchronous else "0", ",".join(map(str, members))],
        )
        outcome, detail = outcome.decode(), detail.decode()
        if outcome == "lost":  # its TTL ran out before the script ran: nothing was accepted
            raise StorageUnavailable(f"the contribution's blob {detail} expired before it could be buffered")
        buffered = await self.r.xlen(self.k.buffer(header.run_id))
        if outcome in ("accepted", "duplicate"):
            return SubmitOutcome(True, outcome == "duplicate", buffered)
        raise refusal(header, outcome, detail)

    async def has_pending(self, run_id: str, edge_id: int) -> bool:
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

    async def buffered_headers(self, run_id: str) -> list[tuple[datetime, EdgeContributionHeader]]:
        return [(datetime.fromtimestamp(_stream_seconds(entry_id), timezone.utc),
                 EdgeContributionHeader.model_validate_json(header))
                for entry_id, header in await self._entry_fields(run_id, Entry.header)]

    async def commit_update(self, run_id: str, expected_version: int, consumed: list[BufferedContribution],
                            new_global: bytes, new_cloud_state: bytes, record: RoundRecord, finished: bool,
                            lease: Lease | None = None) -> bool:
        check_state_sizes(run_id, self.max_value_bytes, global_state=new_global, cloud_state=new_cloud_state)
        meta_key = self.k.meta(run_id)
        async with self.r.pipeline(transaction=True) as p:
            try:
                await p.watch(meta_key, self.k.lease(run_id))
                version, status = await p.hmget(meta_key, [Meta.version, Meta.status])
                if (version is None or status is None or int(text(version)) != expected_version
                        or text(status) not in _UPDATABLE):
                    return False
                if lease is not None and await p.get(self.k.lease(run_id)) != lease.token.encode():
                    return False
                p.multi()
                p.set(self.k.global_state(run_id), new_global)
                p.set(self.k.cloud_state(run_id), new_cloud_state)
                p.hset(meta_key, Meta.version, expected_version + 1)
                p.rpush(self.k.history(run_id), record.model_dump_json())
                p.xdel(self.k.buffer(run_id), *[c.entry_id for c in consumed])
                blob_keys = [c.blob_ref for c in consumed if c.blob_ref is not None]
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


def _stream_seconds(entry_id: bytes | str) -> float:
    """A stream entry id's milliseconds (the Redis server's clock when it was added), as seconds."""
    return int(text(entry_id).split("-")[0]) / 1000


def _field(fields: dict[bytes | str, bytes | str] | None, name: Entry) -> bytes | None:
    value = (fields or {}).get(name.encode())
    return None if value is None else binary(value)


def _buffered(entry_id: bytes | str | None, fields: dict[bytes | str, bytes | str] | None,
              stored: bytes | str | None) -> BufferedContribution:
    """A buffer entry with its blob: `stored` under its blob key, or inline (written before blob keys)."""
    if not isinstance(entry_id, bytes) or fields is None:  # XRANGE gives neither (only XCLAIM's deleted entries)
        raise TypeError(f"unexpected stream entry {entry_id!r} in the contribution buffer")
    header = EdgeContributionHeader.model_validate_json(fields[Entry.header.encode()])
    key = _field(fields, Entry.blob_key)
    blob = _field(fields, Entry.blob) if key is None else optional_binary(stored)
    if blob is None:
        raise LookupError(f"the blob {key!r} of buffer entry {entry_id!r} is missing")
    return BufferedContribution(entry_id.decode(), header, blob, _stream_seconds(entry_id),
                                None if key is None else key.decode())
