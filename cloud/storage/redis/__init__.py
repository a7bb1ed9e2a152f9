"""The storage port in Redis (Redis-specific): `RedisStore` and how the cloud connects to it.

Every key lives under one prefix (keys.py), so several clouds or test sessions can share one Redis; the
scripts that must run atomically on the server are .lua files of this package.
"""
from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fl_services.cloud.storage.redis.base import REDIS_MAX_VALUE
from fl_services.cloud.storage.redis.connection import check_redis, clients
from fl_services.cloud.storage.redis.keys import Entry, Keys, Meta
from fl_services.cloud.storage.redis.store import RedisStore

__all__ = ["REDIS_MAX_VALUE", "Entry", "Keys", "Meta", "RedisStore", "check_redis", "redis_store"]


@asynccontextmanager
async def redis_store(url: str, options: dict[str, Any], *, prefix: str, max_connections: int,
                      pool_timeout_s: float) -> AsyncIterator[RedisStore]:
    """A RedisStore on its own clients (see connection.clients), closed on exit."""
    async with clients(url, options, max_connections, pool_timeout_s) as (asynchronous, bulk):
        yield RedisStore(asynchronous, Keys(prefix), bulk)
