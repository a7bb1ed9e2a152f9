"""Operations API (admin token): the audit log, and revoking one device's token."""
from __future__ import annotations

from fastapi import Query, Request, status

from fl_services.cloud.deps import AuditDep, StoreDep, require_admin
from fl_services.cloud.services import sites as sites_service
from fl_services.cloud.services import tokens
from fl_services.shared.server.auth import guarded_router
from fl_services.shared.server.bodies import read_json
from fl_services.shared.server.docs import json_body_doc
from fl_services.shared.server.errors import error_responses
from fl_services.shared.wire.admin import AuditRecord, Revocation, RevokedToken, SiteInfo

router = guarded_router(require_admin, prefix="/api/v1", tags=["operations"])


@router.get("/audit", responses=error_responses(422))
async def audit_log(store: StoreDep, limit: int = Query(100, ge=1, le=10_000)) -> list[AuditRecord]:
    """The latest admin actions, newest first: who (the admin token's name, the address) did what to what."""
    return await store.audit_log(limit)


@router.post("/tokens/revoked", status_code=status.HTTP_201_CREATED, responses=error_responses(400, 408, 413, 422),
             openapi_extra=json_body_doc(Revocation))
async def revoke_token(request: Request, store: StoreDep, audit: AuditDep) -> RevokedToken:
    """Revokes one device token by its id (what `fedctl issue-token` printed with it; a token derived by
    `fedctl client-token` has the id client-<k>): the edges refuse it from their next refresh on."""
    revocation = await read_json(request, Revocation)  # after the token check
    return await tokens.revoke(store=store, audit=audit, token_id=revocation.token_id)


@router.get("/tokens/revoked")
async def revoked_tokens(store: StoreDep) -> list[RevokedToken]:
    return await store.revoked_tokens()


@router.get("/sites")
async def sites(store: StoreDep) -> list[SiteInfo]:
    """The site registry: every edge that registered, by its name, with its labels, URL, when it was last seen
    (it reports every FL_EDGE_SITE_REPORT_S; offline after three intervals without a report), the devices
    registered at it (counted per state: idle, training, uploading, failed, offline; the first 50 listed, failed
    ones first), the current round of each run it serves, and its last round."""
    return await sites_service.site_registry(store=store)
