"""Control API: create, inspect, start/pause/resume/stop and delete runs; history; model download. Every
change is recorded in the audit log with the caller's identity."""
from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import get_args

from fastapi import Request, Response, status
from fastapi.responses import StreamingResponse

from fl_services.cloud.deps import AuditDep, OrchestratorDep, SettingsDep, StoppingDep, StoreDep, require_admin
from fl_services.cloud.services import runs, sites
from fl_services.cloud.ui.view import LiveRun, read_edges
from fl_services.shared.core.algorithms import registry
from fl_services.shared.core.config import RunConfig
from fl_services.shared.core.reports import RoundRecord
from fl_services.shared.server.auth import guarded_router
from fl_services.shared.server.bodies import binary, read_json
from fl_services.shared.server.docs import binary_answer_doc, json_body_doc
from fl_services.shared.server.errors import error_responses
from fl_services.shared.wire.admin import RunAction, RunEdges, RunInfo, RunSites

router = guarded_router(require_admin, prefix="/api/v1/runs", tags=["runs"])


@router.post("", status_code=status.HTTP_201_CREATED, responses=error_responses(400, 408, 413, 422),
             openapi_extra=json_body_doc(RunConfig))
async def create_run(request: Request, store: StoreDep, settings: SettingsDep, audit: AuditDep) -> RunInfo:
    config = await read_json(request, RunConfig, registry.parse_config)  # after the token check
    return await runs.create(store=store, settings=settings, audit=audit, config=config)


@router.get("")
async def list_runs(store: StoreDep) -> list[RunInfo]:
    return await store.infos(await store.run_ids())


@router.get("/{run_id}", responses=error_responses(404))
async def get_run(run_id: str, store: StoreDep) -> RunInfo:
    return await store.info(run_id)


def _control(action: RunAction) -> Callable[..., Awaitable[RunInfo]]:
    async def control(run_id: str, store: StoreDep, orchestrator: OrchestratorDep, audit: AuditDep) -> RunInfo:
        return await runs.control(store=store, orchestrator=orchestrator, audit=audit, run_id=run_id, action=action)

    control.__doc__ = CONTROL_DOCS[action]
    return control


CONTROL_DOCS: dict[RunAction, str] = {
    "start": "Starts a created run (a run over registered devices waits for them first: status waiting).",
    "pause": "Pauses a running run: no new round starts and no cloud update is applied until it resumes; "
             "contributions still arriving are kept in the buffer (docs/decisions/pause-holds-the-version.md).",
    "resume": "Resumes a paused run: the contributions buffered meanwhile are applied first.",
    "stop": "Stops a run for good (its edges drop its rounds at once).",
}


# One route per action: an action that does not exist is a 404 (as any unknown path), not a 422 of a path parameter.
for _action in get_args(RunAction):
    router.add_api_route(f"/{{run_id}}/{_action}", _control(_action), methods=["POST"], name=f"{_action}_run",
                         summary=f"{_action.capitalize()} Run", responses=error_responses(404, 409))


@router.delete("/{run_id}", status_code=status.HTTP_204_NO_CONTENT, responses=error_responses(404, 409))
async def delete_run(run_id: str, store: StoreDep, orchestrator: OrchestratorDep, audit: AuditDep) -> Response:
    """Deletes a run that is not active (created, waiting, stopped or finished) with everything kept of it: its
    model, history and buffer. A running or paused run is 409: stop it first."""
    await runs.delete(store=store, orchestrator=orchestrator, audit=audit, run_id=run_id)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.get("/{run_id}/history", responses=error_responses(404))
async def history(run_id: str, store: StoreDep) -> list[RoundRecord]:
    return await store.history(run_id)


@router.get("/{run_id}/model", response_class=Response, responses={
    **binary_answer_doc("the global model (safetensors)", headers={"X-FL-Version": {
        "description": "the version of the model", "schema": {"type": "integer"}}}), **error_responses(404)})
async def model(run_id: str, store: StoreDep, orchestrator: OrchestratorDep) -> Response:
    """The global model at the current version as safetensors (X-FL-Version says which)."""
    body, version = await runs.model(store=store, orchestrator=orchestrator, run_id=run_id)
    return binary(body, headers={"X-FL-Version": str(version)})


@router.get("/{run_id}/edges", responses=error_responses(404))
async def edges(run_id: str, store: StoreDep) -> RunEdges:
    """The buffer against B, and per edge its last contribution: the version it was computed on, its
    staleness, and whether it still waits in the buffer."""
    return await read_edges(store, await store.info(run_id), await store.history(run_id))


@router.get("/{run_id}/sites", responses=error_responses(404))
async def run_sites(run_id: str, store: StoreDep) -> RunSites:
    """The sites the run uses and their devices in its current round, as the sites last reported: how many have
    its task, answered it or failed it (with the listed devices' reasons); `all_failed` when every device given
    a task of the current round reported it could not train it."""
    return await sites.run_sites(store=store, run_id=run_id)


@router.get("/{run_id}/events", response_class=StreamingResponse, responses={200: {
    "content": {"text/event-stream": {}}, "description": "`event: update`, data: a RunUpdate (JSON)"},
    **error_responses(404)})
async def events(run_id: str, store: StoreDep, orchestrator: OrchestratorDep,
                 stopping: StoppingDep) -> StreamingResponse:
    """Server-sent events of a run for the dashboard: an update whenever it changes (the first one with
    the whole history, later ones with the new rounds), a comment every 15 s otherwise; the stream ends
    after the final state of a finished or stopped run."""
    live = LiveRun(store, run_id)
    first = await live.update()  # an unknown run is a 404 here, before the stream starts
    return StreamingResponse(live.stream(first, orchestrator, stopping), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
