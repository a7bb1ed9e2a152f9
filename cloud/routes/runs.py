"""Control API: create, inspect, start/pause/resume/stop runs; history; model download."""
from __future__ import annotations

import asyncio
from typing import Literal

from fastapi import APIRouter, Request, status

from cloud.deps import OrchestratorDep, SettingsDep, StoreDep, require_admin
from cloud.initial_state import initial_global
from shared.config import RunConfig
from shared.schemas import GlobalStateHeader, RoundRecord, RunInfo
from shared.transport.records import decode
from shared.transport.tensors import encode
from shared.web import binary, json_body_doc, read_json

router = APIRouter(prefix="/api/v1/runs", tags=["runs"], dependencies=[require_admin])


@router.post("", status_code=status.HTTP_201_CREATED, openapi_extra=json_body_doc(RunConfig))
async def create_run(request: Request, store: StoreDep, settings: SettingsDep) -> RunInfo:
    config = await read_json(request, RunConfig)  # after the token check
    run_id = store.new_run_id()
    blob = await asyncio.to_thread(initial_global, run_id, config, settings.max_state_bytes,
                                   settings.max_payload_bytes)
    await store.create_run(run_id, config, blob)
    return await store.info(run_id)


@router.get("")
async def list_runs(store: StoreDep) -> list[RunInfo]:
    return [await store.info(run_id) for run_id in await store.run_ids()]


@router.get("/{run_id}")
async def get_run(run_id: str, store: StoreDep) -> RunInfo:
    return await store.info(run_id)


@router.post("/{run_id}/{action}")
async def control(
    run_id: str, action: Literal["start", "pause", "resume", "stop"], store: StoreDep, orchestrator: OrchestratorDep
) -> RunInfo:
    await store.transition(run_id, action)
    orchestrator.notify()
    await orchestrator.announce()
    return await store.info(run_id)


@router.get("/{run_id}/history")
async def history(run_id: str, store: StoreDep) -> list[RoundRecord]:
    return await store.history(run_id)


@router.get("/{run_id}/model")
async def model(run_id: str, store: StoreDep, orchestrator: OrchestratorDep):
    """The global model at the current version as safetensors (X-FL-Version says which)."""
    config = await store.config(run_id)
    tensors, header = decode(await store.global_blob(run_id), GlobalStateHeader)
    params = orchestrator.algorithm(run_id, config).model_parameters(tensors)
    return binary(encode(params, header), headers={"X-FL-Version": str(header.version)})
