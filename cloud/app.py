"""The cloud app, which `fl-cloud` (cloud/main.py) serves (under bare uvicorn: `uvicorn
fl_services.cloud.app:create_app --factory --timeout-graceful-shutdown 1`, or a stop waits for the open
long-polls)."""
from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import torch
from fastapi import FastAPI

from fl_services.cloud import retention
from fl_services.cloud.audit import Auditor
from fl_services.cloud.config import CloudSettings
from fl_services.cloud.initial_state import InvalidRun
from fl_services.cloud.metrics import CloudMetrics
from fl_services.cloud.orchestrator import Orchestrator
from fl_services.cloud.routes import admin, edges, health, runs, ui
from fl_services.cloud.services import sites
from fl_services.cloud.storage import Conflict, MemoryStore, NotFound, StorageUnavailable, Store
from fl_services.cloud.storage.redis import redis_store
from fl_services.shared.runtime import cancel_until_done
from fl_services.shared.server.app import Stopping, service_app
from fl_services.shared.server.metrics import switchable


def create_app(settings: CloudSettings | None = None) -> FastAPI:
    settings = settings or CloudSettings()
    metrics = switchable(settings.metrics, lambda: CloudMetrics(settings.long_poll_max_s))

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        torch.set_num_threads(settings.torch_threads)
        async with opened_store(settings) as store:
            orchestrator = Orchestrator(store, metrics, settings.replica, settings.lease_s,
                                        settings.max_update_failures, settings.compute_device)
            metrics.watch_store(store)
            app.state.settings, app.state.store, app.state.orchestrator = settings, store, orchestrator
            tasks = [asyncio.create_task(orchestrator.run_forever()),
                     asyncio.create_task(orchestrator.relay_events()),
                     asyncio.create_task(_wake_on_stop(app.state.stopping, orchestrator)),
                     asyncio.create_task(sites.admit_forever(
                         store=store, orchestrator=orchestrator, interval_s=settings.admission_interval_s,
                         audit=Auditor(store, "admission", settings.audit_max_entries)))]
            if settings.retain_days is not None or settings.retain_runs is not None:
                tasks.append(asyncio.create_task(retention.run_forever(
                    store, settings.retain_days, settings.retain_runs, settings.retention_interval_s,
                    Auditor(store, "retention", settings.audit_max_entries))))
            try:
                yield
            finally:
                orchestrator.stop()
                await cancel_until_done(tasks)  # the event channel's listener, say, may lose a first cancel

    routers = [health.router, runs.router, edges.router, admin.router]
    app = service_app("FL cloud", lifespan, settings.max_payload_bytes, routers,
                      errors={NotFound: 404, Conflict: 409, InvalidRun: 422, StorageUnavailable: 503},
                      metrics=metrics, metrics_token=settings.metrics_token, server=settings)
    ui.mount(app)
    return app


log = logging.getLogger(__name__)


@asynccontextmanager
async def opened_store(settings: CloudSettings) -> AsyncIterator[Store]:
    """The storage the settings name, for the app's lifetime."""
    if settings.storage == "memory":
        log.warning("the cloud keeps its state in this process's memory (FL_CLOUD_STORAGE=memory): every run is "
                    "lost when it stops")
        yield MemoryStore()
        return
    async with redis_store(settings.redis_url, settings.redis_options(), prefix=settings.key_prefix,
                           max_connections=settings.redis_max_connections,
                           pool_timeout_s=settings.redis_pool_timeout_s, blob_dir=settings.blob_dir,
                           blob_orphan_s=settings.blob_orphan_s) as store:
        yield store


async def _wake_on_stop(stopping: Stopping, orchestrator: Orchestrator) -> None:
    """Long-polls and event streams answer at once when the process is told to stop."""
    await stopping.wait()
    await orchestrator.wake_waiters()

