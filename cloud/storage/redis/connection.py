"""Connecting to Redis, and translating what redis-py raises into the storage port's exceptions
(Redis-specific)."""
from __future__ import annotations

import functools
import inspect
import logging
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, ParamSpec, TypeVar
from urllib.parse import urlsplit

import redis
import redis.asyncio as aioredis
from redis.exceptions import AuthenticationError, NoPermissionError, RedisError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from fl_services.cloud.storage.ports import StorageError, StorageRefused, StorageUnavailable

log = logging.getLogger(__name__)
P = ParamSpec("P")
R = TypeVar("R")
C = TypeVar("C", bound=type)


def check_redis(url: str, options: dict[str, Any]) -> None:
    """One PING before the cloud serves: StorageRefused if Redis refuses the cloud's credentials or TLS fails.
    Otherwise every request would answer 503 and the orchestrator log a traceback a second, for good. A Redis
    not reachable yet is no refusal: the cloud starts and waits for it, as for a restart."""
    parts = urlsplit(url)
    where = f"{parts.hostname}:{parts.port or 6379}"  # never the URL itself: it holds the password
    client = redis.Redis.from_url(url, socket_connect_timeout=5, socket_timeout=5, **options)
    try:
        client.ping()
    except (AuthenticationError, NoPermissionError) as exc:
        raise StorageRefused(f"Redis at {where} refused the cloud's credentials ({exc}): check the password or "
                             "ACL user in FL_CLOUD_REDIS_URL (redis://USER:PASSWORD@HOST:PORT/DB) or "
                             "FL_CLOUD_REDIS_PASSWORD") from None
    except RedisConnectionError as exc:
        tls_error = _ssl_error(exc)
        if tls_error is not None:
            raise StorageRefused(f"TLS with Redis at {where} failed ({tls_error}): check FL_CLOUD_REDIS_CA_FILE, "
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


@asynccontextmanager
async def clients(url: str, options: dict[str, Any], max_connections: int,
                  pool_timeout_s: float) -> AsyncIterator[tuple[aioredis.Redis, redis.Redis]]:
    """The asyncio client, and the blocking one for the contributions' blobs (RedisStore.bulk), each over a
    pool of at most `max_connections`. Blocking pools: over their size a command waits for a connection (up
    to `pool_timeout_s`, then StorageUnavailable: 503) instead of failing at once, as redis-py's default
    pool does."""
    asynchronous = aioredis.Redis.from_pool(aioredis.BlockingConnectionPool.from_url(
        url, max_connections=max_connections, timeout=pool_timeout_s, **options))
    bulk = redis.Redis.from_pool(redis.BlockingConnectionPool.from_url(
        url, max_connections=max_connections, timeout=pool_timeout_s, **options))
    try:
        yield asynchronous, bulk
    finally:
        await asynchronous.aclose()
        bulk.close()


def translated(method: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]:
    """`method`, raising the port's exceptions where redis-py raised its own."""
    @functools.wraps(method)
    async def call(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return await method(*args, **kwargs)
        except (RedisConnectionError, RedisTimeoutError) as exc:  # an AuthenticationError too, once serving
            raise StorageUnavailable(str(exc)) from exc
        except RedisError as exc:
            raise StorageError(f"Redis: {type(exc).__name__}: {exc}") from exc
    return call


def translating(cls: C) -> C:
    """Every public coroutine method of `cls` translated: no redis-py exception leaves the adapter."""
    for name, member in inspect.getmembers(cls, inspect.iscoroutinefunction):
        if not name.startswith("_"):
            setattr(cls, name, translated(member))
    return cls
