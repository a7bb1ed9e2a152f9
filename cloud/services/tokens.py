"""Revoking a device token, recorded in the audit log."""
from __future__ import annotations

from fl_services.cloud.audit import Auditor
from fl_services.cloud.storage import Store
from fl_services.shared.wire.admin import RevokedToken


async def revoke(*, store: Store, audit: Auditor, token_id: str) -> RevokedToken:
    """The edges refuse the token from their next refresh of the revoked ids on."""
    revoked = await store.revoke_token(token_id)
    await audit("revoke", token_id)
    return revoked
