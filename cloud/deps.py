"""FastAPI dependencies of the cloud: settings, store, orchestrator, the two bearer guards, a registered edge,
and what an edge's requests carry (its state long-poll's query, its contribution)."""
from __future__ import annotations

from typing import Annotated

from fastapi import Depends, HTTPException, Query, Request, status

from fl_services.cloud.audit import Auditor
from fl_services.cloud.config import CloudSettings
from fl_services.cloud.orchestrator import Orchestrator
from fl_services.cloud.services.contributions import EdgeContribution
from fl_services.cloud.services.edges import StatePoll
from fl_services.cloud.storage import NotFound, Store
from fl_services.shared.core.reports import EdgeContributionHeader
from fl_services.shared.server.app import Stopping, app_state
from fl_services.shared.server.auth import bearer_guard, bearer_token, unauthorized
from fl_services.shared.server.bodies import read_message, same_as_url
from fl_services.shared.server.quotas import rate_limited

SettingsDep = Annotated[CloudSettings, Depends(app_state("settings"))]
StoreDep = Annotated[Store, Depends(app_state("store"))]
OrchestratorDep = Annotated[Orchestrator, Depends(app_state("orchestrator"))]
StoppingDep = Annotated[Stopping, Depends(app_state("stopping"))]


async def admin_name(request: Request) -> str:
    """The name of the admin token the request carries ("admin", or one of admin_tokens), or 401."""
    name = request.app.state.settings.admin_name(await bearer_token(request))
    if name is None:
        raise unauthorized()
    return name


async def auditor(request: Request, actor: Annotated[str, Depends(admin_name)]) -> Auditor:
    """Records the request's admin actions under the caller's name and address."""
    state = request.app.state
    return Auditor(state.store, actor, state.settings.audit_max_entries,
                   request.client.host if request.client else None)


AuditDep = Annotated[Auditor, Depends(auditor)]
require_admin = Depends(admin_name)
require_edge = Depends(bearer_guard(lambda r: r.app.state.settings.edge_token))


async def known_edge(edge_id: int, store: StoreDep) -> int:
    """The path's edge, 404 unless it registered (a cloud on a fresh Redis tells its edges to register again)."""
    if not await store.edge_known(edge_id):
        raise NotFound(f"unknown edge {edge_id}; register first")
    return edge_id


KnownEdge = Annotated[int, Depends(known_edge)]


async def state_poll(
    seen: list[str] = Query([], max_length=1000, description="'run_id:version' of every run the edge has a state of"),
    busy: list[str] = Query([], max_length=1000, description="runs the edge is working on: never offered"),
    others: bool = Query(True, description="false: offer only the runs in `seen`"),
    run_id: str | None = Query(None, description="with `after`: one more `seen` entry"),
    after: int = Query(-1, ge=-1),
) -> StatePoll:
    """`seen` entries "run_id:version" (422 otherwise); `run_id` with `after` is one more."""
    versions: dict[str, int] = {}
    for entry in seen:
        run, _, version = entry.rpartition(":")
        if not run or not version.lstrip("-").isdigit() or int(version) < -1:
            raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT,
                                f"seen entry {entry[:100]!r} is not 'run_id:version' with a version ≥ -1")
        versions[run] = int(version)
    if run_id is not None:
        versions[run_id] = after
    return StatePoll(versions, frozenset(busy), others)


StatePollDep = Annotated[StatePoll, Depends(state_poll)]


async def edge_contribution(edge_id: int, request: Request, store: StoreDep) -> EdgeContribution:
    """The contribution in the body of a registered edge (known_edge), read once the edge's rate allows: a
    flood is refused before anything is read, a malformed body before the edge is looked up. 422 unless its
    header names the path's edge."""
    await rate_limited(request, "contribution", edge_id)
    tensors, header, blob = await read_message(request, EdgeContributionHeader)
    same_as_url("header edge_id", header.edge_id, edge_id)
    await known_edge(edge_id, store)
    return EdgeContribution(tensors, header, blob)


ContributionDep = Annotated[EdgeContribution, Depends(edge_contribution)]
