"""What the cloud records beside its runs, in Redis: the edge registry and the site registry (hashes; the sites with
an index of each edge's site name, written with them by a script), the audit log (a capped stream) and the revoked
device tokens (a hash) (Redis-specific)."""
from __future__ import annotations

import json

from fl_services.cloud.storage.ports import NotFound, now, site_record
from fl_services.cloud.storage.redis.base import RedisBase
from fl_services.shared.wire.admin import AuditRecord, RevokedToken, SiteInfo
from fl_services.shared.wire.edge_cloud import EdgeRegistration


class RedisRecords(RedisBase):
    async def register_edge(self, reg: EdgeRegistration) -> None:
        record = {"edge_id": reg.edge_id, "url": reg.url, "registered_at": now().isoformat()}
        await self.r.hset(self.k.edges, str(reg.edge_id), json.dumps(record))

    async def edge_known(self, edge_id: int) -> bool:
        return bool(await self.r.hexists(self.k.edges, str(edge_id)))

    async def registered_edges(self) -> set[int]:
        return {int(edge_id) for edge_id in await self.r.hkeys(self.k.edges)}

    async def report_site(self, reg: EdgeRegistration) -> SiteInfo:
        earlier = await self.r.hget(self.k.sites, reg.site_name)
        record = site_record(reg, SiteInfo.model_validate_json(earlier) if earlier is not None else None)
        taken = await self.scripts.site_report(keys=[self.k.sites, self.k.site_names],
                                               args=[reg.edge_id, record.name, record.model_dump_json()])
        if taken is not None:  # another edge took the name since it was read: refused as it would have been then
            site_record(reg, SiteInfo.model_validate_json(taken))
        return record

    async def sites(self) -> list[SiteInfo]:
        records = [SiteInfo.model_validate_json(v) for v in (await self.r.hgetall(self.k.sites)).values()]
        return sorted(records, key=lambda site: site.name)

    async def remove_site(self, name: str) -> None:
        if not await self.scripts.site_remove(keys=[self.k.sites, self.k.site_names], args=[name]):
            raise NotFound(f"no site named {name!r}")

    async def audit(self, record: AuditRecord, max_entries: int) -> None:
        # Trimmed as Redis finds cheapest (whole nodes): about max_entries are kept, never fewer.
        await self.r.xadd(self.k.audit, {"record": record.model_dump_json()}, maxlen=max_entries, approximate=True)

    async def audit_log(self, limit: int) -> list[AuditRecord]:
        entries = await self.r.xrevrange(self.k.audit, count=limit)
        return [AuditRecord.model_validate_json(fields[b"record"]) for _, fields in entries or [] if fields]

    async def revoke_token(self, token_id: str) -> RevokedToken:
        record = RevokedToken(token_id=token_id, revoked_at=now())
        await self.r.hsetnx(self.k.revoked_tokens, token_id, record.model_dump_json())
        kept = await self.r.hget(self.k.revoked_tokens, token_id)
        return RevokedToken.model_validate_json(kept) if kept is not None else record

    async def revoked_tokens(self) -> list[RevokedToken]:
        records = [RevokedToken.model_validate_json(v) for v in (await self.r.hgetall(self.k.revoked_tokens)).values()]
        return sorted(records, key=lambda r: r.revoked_at)
