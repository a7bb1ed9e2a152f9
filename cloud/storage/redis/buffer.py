"""Each run's contribution buffer in Redis, and the cloud update that consumes it (Redis-specific).

- A contribution is accepted by one Lua script (submit.lua) that checks the idempotency key, the run's status
  and version, the edge's slot and that the edge has no contribution still waiting in the buffer, then
  appends to the buffer stream the header and the key of its blob; either all of that happens or none.
  The blob itself is SET just before, with a TTL: the script makes it permanent when it accepts the
  contribution and deletes it when it refuses it, and a cloud that dies in between leaves it to expire.
  With a blob directory (`BlobFiles`) the blob is instead a file, fsynced and renamed into place before the
  script, which appends the file's name; a refused blob's file is deleted after it, and a cloud that dies in
  between leaves an orphan that `sweep_blob_files` deletes once it is old (never one an entry references).
- An update commits the new global state, the new version, the history record and the deletion of the
  consumed stream entries and their blobs in one MULTI/EXEC, guarded by WATCH on the run's meta hash and its
  lease (the fencing of a lease that expired meanwhile); their blob files are deleted once it has committed.
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
# How long a swept blob file's tombstone is kept: longer than any submit could stall between its write and script.
SWEPT_MS = 7 * 86_400_000
_UPDATABLE = {status.value for status in UPDATABLE}


class RedisBuffer(RedisBase):
    async def submit(self, header: EdgeContributionHeader, blob: bytes, synchronous: bool,
                     members: Sequence[int] = ()) -> SubmitOutcome:
        run_id = header.run_id
        if self.files is None:
            # The blob goes in by a plain SET, the cheapest write of its bytes (and of their append to the AOF),
            # not as an argument of the script: Lua would copy it twice more, and a script's effects are written
            # to the AOF as one more command carrying it. The script then keeps it (or deletes it) atomically.
            file, staged = "", self.k.contribution(run_id, secrets.token_hex(12))
            if self.bulk is None:
                await self.r.set(staged, blob, px=STAGED_MS)
            else:
                await asyncio.to_thread(self.bulk.set, staged, blob, px=STAGED_MS)
        else:
            # Durable on the shared volume before the script references it: an accepted entry's file is there.
            file = self.files.new_name()
            staged = self.k.swept_blob_file(file)
            try:
                await asyncio.to_thread(self.files.write, file, blob)
            except OSError as exc:  # the volume full or away: nothing was accepted, the edge retries (503)
                raise StorageUnavailable(f"could not write the contribution's blob to {self.files.directory}: "
                                         f"{exc}") from exc
        # Should the script fail (Redis away) the file stays: the script may have run, and a sweep deletes it by
        # age if no entry references it.
        outcome, detail = await self.scripts.submit(  # in the order the script's header names them
            keys=[self.k.meta(run_id), self.k.idempotency(run_id), self.k.slots(run_id), self.k.buffer(run_id),
                  self.k.pending(run_id), staged, self.k.member_sites(run_id)],
            args=[header.idempotency_key, header.edge_id, header.base_version,
                  header.model_dump_json(), "1" if synchronous else "0", ",".join(map(str, members)), file],
        )
        outcome, detail = outcome.decode(), detail.decode()
        if file and outcome != "accepted":
            await self._delete_files([file])
        if outcome == "lost":  # its TTL ran out (or it was swept) before the script ran: nothing was accepted
            raise StorageUnavailable(f"the contribution's blob {detail} expired (or was swept as an orphan) before it "
                                     "could be buffered")
        buffered = await self.r.xlen(self.k.buffer(run_id))
        if outcome in ("accepted", "duplicate"):
            return SubmitOutcome(True, outcome == "duplicate", buffered)
        raise refusal(header, outcome, detail)

    async def has_pending(self, run_id: str, edge_id: int) -> bool:
        return bool(await self.r.hexists(self.k.pending(run_id), str(edge_id)))

    async def buffered(self, run_id: str, count: int) -> list[BufferedContribution]:
        while True:
            entries = await self.r.xrange(self.k.buffer(run_id), count=count) or []
            keys = [_field(fields, Entry.blob_key) for _, fields in entries]
            stored = [k for k in keys if k is not None]
            blobs = [] if not stored else (await self.r.mget(stored) if self.bulk is None
                                           else await asyncio.to_thread(self.bulk.mget, stored))
            names = [_field(fields, Entry.blob_file) for _, fields in entries]
            in_files = [n.decode() for n in names if n is not None]
            files = await asyncio.to_thread(self._read_files, in_files)
            missing = {name for name, blob in zip(in_files, files, strict=True) if blob is None}
            if not missing:
                break
            if missing & await self._referenced_files(run_id):  # an accepted update's blob: never skipped
                raise LookupError(f"blob files {sorted(missing)} of entries still buffered are missing from "
                                  f"{self.files.directory if self.files else 'this cloud (no blob directory)'}: "
                                  "is FL_CLOUD_BLOB_DIR set to a volume every cloud replica shares?")
            # Consumed since they were listed (another replica's update, which deleted them): read again.
        found, from_files = iter(blobs), iter(files)
        return [_buffered(entry_id, fields,
                          next(found) if key is not None else next(from_files) if name is not None else None)
                for (entry_id, fields), key, name in zip(entries, keys, names, strict=True)]

    def _read_files(self, names: list[str]) -> list[bytes | None]:
        """The blob files `names`, None for those missing."""
        blobs: list[bytes | None] = []
        for name in names:
            try:
                blobs.append(None if self.files is None else self.files.read(name))
            except FileNotFoundError:
                blobs.append(None)
        return blobs

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
                refs = [c.blob_ref for c in consumed if c.blob_ref is not None]
                blob_keys, files = [r for r in refs if not _is_file(r)], [r for r in refs if _is_file(r)]
                if blob_keys:
                    p.delete(*blob_keys)
                p.hdel(self.k.pending(run_id), *[str(c.header.edge_id) for c in consumed])
                if finished:
                    p.hset(meta_key, mapping={Meta.status: RunStatus.finished.value,
                                              Meta.finished_at: now().isoformat()})
                    p.srem(self.k.active, run_id)
                await p.execute()
            except WatchError:
                return False
        # Only once the entries are gone: a crash before leaves them buffered with their files (the update is
        # redone), one after leaves orphan files (swept by age).
        await self._delete_files(files)
        return True

    async def sweep_blob_files(self) -> list[str]:
        """Deletes the blob files that no buffer entry references and that were last written more than the blob
        directory's orphan age ago: a cloud killed between a file's write and its submit script, or between an
        update's commit and the deletion of its files, left them. Returns their names."""
        if self.files is None:
            return []
        aged, partials = await asyncio.to_thread(self.files.aged)
        await asyncio.to_thread(self.files.delete, partials)  # never renamed into place: never referenced
        if not aged:
            return partials
        # Tombstones first: a submit script that has not run yet refuses these names from now on, so no entry can
        # come to reference one of them once the references are read below.
        async with self.r.pipeline(transaction=False) as p:
            for name in aged:
                p.set(self.k.swept_blob_file(name), 1, px=SWEPT_MS)
            await p.execute()
        referenced: set[str] = set()
        for run_id in await self.r.lrange(self.k.runs, 0, -1):
            referenced |= await self._referenced_files(text(run_id))
        orphans = [name for name in aged if name not in referenced]
        await asyncio.to_thread(self.files.delete, orphans)
        if len(orphans) < len(aged):
            await self.r.delete(*[self.k.swept_blob_file(name) for name in aged if name in referenced])
        return orphans + partials


def _stream_seconds(entry_id: bytes | str) -> float:
    """A stream entry id's milliseconds (the Redis server's clock when it was added), as seconds."""
    return int(text(entry_id).split("-")[0]) / 1000


def _field(fields: dict[bytes | str, bytes | str] | None, name: Entry) -> bytes | None:
    value = (fields or {}).get(name.encode())
    return None if value is None else binary(value)


def _is_file(blob_ref: str) -> bool:
    """Whether a BufferedContribution's blob_ref names a blob file (a token, no colon) or a key (prefix:…)."""
    return ":" not in blob_ref


def _buffered(entry_id: bytes | str | None, fields: dict[bytes | str, bytes | str] | None,
              stored: bytes | str | None) -> BufferedContribution:
    """A buffer entry with its blob: `stored` under its blob key or in its blob file, or inline (written before
    blob keys)."""
    if not isinstance(entry_id, bytes) or fields is None:  # XRANGE gives neither (only XCLAIM's deleted entries)
        raise TypeError(f"unexpected stream entry {entry_id!r} in the contribution buffer")
    header = EdgeContributionHeader.model_validate_json(fields[Entry.header.encode()])
    key = _field(fields, Entry.blob_key) or _field(fields, Entry.blob_file)
    blob = _field(fields, Entry.blob) if key is None else optional_binary(stored)
    if blob is None:
        raise LookupError(f"the blob {key!r} of buffer entry {entry_id!r} is missing")
    return BufferedContribution(entry_id.decode(), header, blob, _stream_seconds(entry_id),
                                None if key is None else key.decode())
