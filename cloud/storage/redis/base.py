"""What every part of the Redis adapter shares: its clients, its keys, its scripts, and the reading of redis-py's
replies (Redis-specific)."""
from __future__ import annotations

import asyncio
import logging

import redis
import redis.asyncio as aioredis

from fl_services.cloud.storage.blob_files import BlobFiles
from fl_services.cloud.storage.redis.keys import Entry, Keys
from fl_services.cloud.storage.redis.scripts import Scripts

log = logging.getLogger(__name__)
# Redis's default proto-max-bulk-len: no single value may be larger.
REDIS_MAX_VALUE = 512 * 2**20


class RedisBase:
    def __init__(self, client: aioredis.Redis, keys: Keys, bulk: redis.Redis | None = None,
                 max_value_bytes: int = REDIS_MAX_VALUE, blob_files: BlobFiles | None = None):
        self.r = client
        self.k = keys
        # A blocking client for the contributions' blobs, used on a worker thread: it hands a 60 MB value to
        # the socket as it is, where the asyncio client's transport first copies it into its buffer twice and
        # then writes it one event-loop turn at a time (a SET of 60 MB took 0.3-0.4 s longer). None: the
        # asyncio client does it all.
        self.bulk = bulk
        # Over it Redis drops the connection, which redis-py reports as a WatchError inside a transaction: the
        # update would be recomputed forever without a word (StateTooLarge instead).
        self.max_value_bytes = max_value_bytes
        self.scripts = Scripts(client)
        # Where contributions' blobs go: files on a volume every replica shares, only their names in Redis (a
        # write fsynced at disk speed, where a SET of the same bytes waits for Redis' AOF); None: in Redis.
        # Entries written either way read back either way.
        self.files = blob_files

    async def _entry_fields(self, run_id: str, field: Entry) -> list[tuple[bytes, bytes]]:
        """Every buffer entry's id and its `field`, in stream order (entries without it left out)."""
        flat = await self.scripts.entry_fields(keys=[self.k.buffer(run_id)], args=[field.value])
        return list(zip(flat[::2], flat[1::2], strict=True))

    async def _referenced_files(self, run_id: str) -> set[str]:
        """The names of the blob files the run's buffer entries reference."""
        return {name.decode() for _, name in await self._entry_fields(run_id, Entry.blob_file)}

    async def _delete_files(self, names: list[str]) -> None:
        """Deletes blob files no entry references (consumed, or refused at their submit)."""
        if names and self.files is not None:
            try:
                await asyncio.to_thread(self.files.delete, names)
            except OSError:  # the volume away: what nothing references any more is swept later
                log.warning("could not delete blob files %s that nothing references; a sweep will", names,
                            exc_info=True)


# redis-py types every reply as bytes | str (str under decode_responses=True); this adapter's clients are made
# without it, so its replies are bytes. These say so once instead of at every call.
def text(reply: bytes | str) -> str:
    return reply.decode() if isinstance(reply, bytes) else reply


def binary(reply: bytes | str) -> bytes:
    if isinstance(reply, str):
        raise TypeError("the store's Redis client must not decode responses: its values are binary")
    return reply


def optional_binary(reply: bytes | str | None) -> bytes | None:
    return None if reply is None else binary(reply)
