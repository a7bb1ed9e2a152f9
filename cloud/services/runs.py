"""The runs' control actions, each recorded in the audit log, and the model a run serves."""
from __future__ import annotations

import asyncio

from fl_services.cloud.audit import Auditor
from fl_services.cloud.config import CloudSettings
from fl_services.cloud.initial_state import checked_initial_global
from fl_services.cloud.orchestrator import Orchestrator
from fl_services.cloud.services import sites
from fl_services.cloud.storage import Conflict, Store
from fl_services.shared.core.config import RunConfig
from fl_services.shared.core.records import decode
from fl_services.shared.core.tensors import encode
from fl_services.shared.wire.admin import RunAction, RunInfo
from fl_services.shared.wire.edge_cloud import GlobalStateHeader


async def create(*, store: Store, settings: CloudSettings, audit: Auditor, config: RunConfig) -> RunInfo:
    """A new run at version 0, once its initial global state is built and within the limits (InvalidRun)."""
    config = await sites.resolve(store=store, config=config)
    run_id = store.new_run_id()
    blob = await checked_initial_global(run_id, config, settings.max_state_bytes, settings.max_payload_bytes,
                                        settings.allowed_import_prefixes, settings.create_timeout_s)
    await store.create_run(run_id, config, blob)
    await audit("create", run_id, f"{config.algorithm} {config.name!r}")
    return await store.info(run_id)


async def control(*, store: Store, orchestrator: Orchestrator, audit: Auditor, run_id: str,
                  action: RunAction) -> RunInfo:
    """A run over registered devices (a selection) starts by waiting for them (sites.admit_waiting)."""
    if action == "start" and (await store.config(run_id)).selection is not None:
        try:
            await store.transition(run_id, "wait")
        except Conflict:  # said as the action asked for: waiting is how such a run starts
            raise Conflict(f"cannot start a run that is {(await store.info(run_id)).status.value}") from None
    else:
        await store.transition(run_id, action)
    orchestrator.notify()
    await orchestrator.announce()  # wakes the edges' long-polls: a stop releases them (their end signal)
    await audit(action, run_id)
    return await store.info(run_id)


async def delete(*, store: Store, orchestrator: Orchestrator, audit: Auditor, run_id: str) -> None:
    """Deletes a run that is not active with everything kept of it (Conflict for a running or paused run). A
    waiting run may go: no edge serves it yet."""
    await store.delete_run(run_id)
    await orchestrator.announce()
    await audit("delete", run_id)


async def model(*, store: Store, orchestrator: Orchestrator, run_id: str) -> tuple[bytes, int]:
    """The global model at the current version as safetensors, and that version."""
    algorithm = orchestrator.algorithm(run_id, await store.config(run_id))
    blob = await store.global_blob(run_id)

    def model_blob() -> tuple[bytes, int]:  # copies the whole model twice: off the loop
        tensors, header = decode(blob, GlobalStateHeader)
        return encode(algorithm.model_parameters(tensors), header), header.version

    return await asyncio.to_thread(model_blob)
