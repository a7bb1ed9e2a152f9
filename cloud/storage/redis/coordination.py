"""What several cloud replicas sharing one Redis coordinate through: each run's update lease (a token under a
TTL: SET NX PX to take it, Lua compare-and-set of its TTL to extend it, compare-and-delete to release it) and
the event channel (pub/sub) that wakes every replica's waiters (Redis-specific)."""
from __future__ import annotations

from collections.abc import Awaitable, Callable

import redis.asyncio as aioredis

from fl_services.cloud.storage.ports import Lease, LeaseLost, lease_token
from fl_services.cloud.storage.redis.base import RedisBase, text


class RedisCoordination(RedisBase):
    async def acquire_lease(self, run_id: str, ttl_s: float, holder: str) -> Lease | None:
        lease = Lease(run_id, lease_token(holder), ttl_s)
        taken = await self.r.set(self.k.lease(run_id), lease.token, nx=True, px=_ms(ttl_s))
        return lease if taken else None

    async def extend_lease(self, lease: Lease) -> None:
        if not await self.scripts.lease_extend(keys=[self.k.lease(lease.run_id)], args=[lease.token, _ms(lease.ttl_s)]):
            raise LeaseLost(f"run {lease.run_id}: the update lease expired")

    async def release_lease(self, lease: Lease) -> None:
        if not await self.scripts.lease_release(keys=[self.k.lease(lease.run_id)], args=[lease.token]):
            raise LeaseLost(f"run {lease.run_id}: the update lease expired before it was released")

    async def publish(self, message: str) -> None:
        await self.r.publish(self.k.events, message)

    async def listen(self, subscribed: Callable[[], Awaitable[None]], heard: Callable[[str], Awaitable[None]]) -> None:
        # One connection for the whole process, whatever the number of waiters it wakes; its own, outside the
        # bounded pool, so that requests holding every pooled connection can never keep the wake-ups waiting.
        pool = self.r.connection_pool
        own = aioredis.ConnectionPool(connection_class=pool.connection_class, max_connections=1,
                                      **pool.connection_kwargs)
        try:
            async with aioredis.Redis(connection_pool=own).pubsub(ignore_subscribe_messages=True) as pubsub:
                await pubsub.subscribe(self.k.events)
                await subscribed()
                async for message in pubsub.listen():
                    if message.get("type") == "message":
                        await heard(text(message["data"]))
        finally:
            await own.disconnect()


def _ms(seconds: float) -> int:
    return int(seconds * 1000)
