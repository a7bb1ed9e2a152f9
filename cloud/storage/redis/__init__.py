"""The storage port in Redis (Redis-specific): `RedisStore` and how the cloud connects to it.

Every key lives under one prefix (keys.py), so several clouds or test sessions can share one Redis; the
scripts that must run atomically on the server are .lua files of this package.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from fl_services.cloud.storage.blob_files import BlobFiles
from fl_services.cloud.storage.ports import StorageRefused
from fl_services.cloud.storage.redis.base import REDIS_MAX_VALUE
from fl_services.cloud.storage.redis.connection import check_redis, clients
from fl_services.cloud.storage.redis.keys import Entry, Keys, Meta
from fl_services.cloud.storage.redis.store import RedisStore
from fl_services.shared.runtime import cancel_until_done

log = logging.getLogger(__name__)
__all__ = ["REDIS_MAX_VALUE", "Entry", "Keys", "Meta", "RedisStore", "check_redis", "prepared_blob_files",
           "redis_store"]


@asynccontextmanager
async def redis_store(url: str, options: dict[str, Any], *, prefix: str, max_connections: int,
                      pool_timeout_s: float, blob_dir: Path | None = None,
                      blob_orphan_s: float = 3600.0) -> AsyncIterator[RedisStore]:
    """A RedisStore on its own clients (see connection.clients), closed on exit; with `blob_dir`, contributions'
    blobs in files there (under the prefix's own directory), orphans among them swept at once and every quarter
    of `blob_orphan_s`."""
    files = None if blob_dir is None else prepared_blob_files(blob_dir, prefix=prefix, orphan_s=blob_orphan_s)
    async with clients(url, options, max_connections, pool_timeout_s) as (asynchronous, bulk):
        store = RedisStore(asynchronous, Keys(prefix), bulk, blob_files=files)
        if files is None:
            yield store
            return
        sweeping = asyncio.create_task(_sweep_forever(store, blob_orphan_s / 4))
        try:
            yield store
        finally:
            await cancel_until_done([sweeping])


def prepared_blob_files(blob_dir: Path, *, prefix: str, orphan_s: float) -> BlobFiles:
    """The blob files under `blob_dir`, their directory created; StorageRefused if it cannot be written, which
    every submit would otherwise answer with a 503 that its edge retries for ever."""
    files = BlobFiles(blob_dir, prefix, orphan_s)
    try:
        files.prepare()
    except OSError as exc:
        raise StorageRefused(f"the blob directory FL_CLOUD_BLOB_DIR={blob_dir} cannot hold contributions' blobs "
                             f"({exc.strerror or exc}: {exc.filename or files.directory}): set it to a writable "
                             "directory, on a volume every cloud replica mounts") from None
    return files


async def _sweep_forever(store: RedisStore, interval_s: float) -> None:
    while True:
        try:
            swept = await store.sweep_blob_files()
            if swept:
                log.warning("deleted %d orphan blob files (a cloud stopped between a blob's write and its "
                            "buffering, or an update's commit and its files' deletion): %s", len(swept),
                            ", ".join(swept))
        except asyncio.CancelledError:
            raise
        except Exception:  # Redis or the volume away: the next turn tries again
            log.exception("sweeping orphan blob files failed; trying again in %g s", interval_s)
        await asyncio.sleep(interval_s)
