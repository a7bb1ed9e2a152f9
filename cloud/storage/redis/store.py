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

    async def migrate(self) -> None:
        """Besides the runs' layout: a live run over registered devices written before the member index (which
        site holds each device) gets one, from its history then its buffer, in acceptance order, as submit
        would have made it."""
        await super().migrate()
        for run_id in await self.active_runs():
            key = self.k.member_sites(run_id)
            if (await self.config(run_id)).selection is None or await self.r.exists(key):
                continue
            declared = [(c.edge_id, c.members or []) for record in await self.history(run_id)
                        for c in record.contributions]
            declared += [(h.edge_id, [m.client_id for m in h.members or []])
                         for _, h in await self.buffered_headers(run_id)]
            async with self.r.pipeline(transaction=True) as p:
                for edge_id, members in declared:
                    for device in members:
                        p.hsetnx(key, str(device), str(edge_id))
                await p.execute()
