"""The audit log of admin actions: who (which admin token, from which address) did what to which run or
token. Kept by the storage as a capped log (`AuditLog`), read with GET /api/v1/audit."""
from __future__ import annotations

from dataclasses import dataclass

from fl_services.cloud.storage import Store, now
from fl_services.shared.wire.admin import AuditRecord


@dataclass(frozen=True)
class Auditor:
    """Records the actions of one caller (a request's, or the retention task's)."""

    store: Store
    actor: str
    max_entries: int
    address: str | None = None

    async def __call__(self, action: str, target: str, detail: str | None = None) -> None:
        record = AuditRecord(at=now(), actor=self.actor, address=self.address, action=action, target=target,
                             detail=detail)
        await self.store.audit(record, self.max_entries)
