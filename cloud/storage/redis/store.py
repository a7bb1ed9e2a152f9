"""RedisStore: the storage port kept in Redis (Redis-specific; every key in keys.py)."""
from __future__ import annotations

from fl_services.cloud.storage.ports import Store
from fl_services.cloud.storage.redis.buffer import RedisBuffer
from fl_services.cloud.storage.redis.connection import translating
from fl_services.cloud.storage.redis.coordination import RedisCoordination
from fl_services.cloud.storage.redis.records import RedisRecords
from fl_services.cloud.storage.redis.runs import RedisRuns


@translating
class RedisStore(RedisRuns, RedisBuffer, RedisCoordination, RedisRecords, Store):
    """Runs, buffers, edges, leases, events, audit and revocations in one Redis, under one key prefix, shared
    by every replica of the cloud. Every method raises the port's exceptions, never redis-py's."""
