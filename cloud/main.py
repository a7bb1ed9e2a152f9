"""The cloud app: `fl-cloud` (under bare uvicorn: `uvicorn fl_services.cloud.main:create_app --factory
--timeout-graceful-shutdown 1`, or a stop waits for the open long-polls)."""
from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

from fl_services.cloud.config import CloudSettings
from fl_services.cloud.storage import Conflict, MemoryStore, NotFound, StorageRefused, StorageUnavailable, Store
from fl_services.cloud.storage.redis import check_redis, prepared_blob_files, redis_store
from fl_services.shared.runtime.log import configure_logging
from fl_services.shared.runtime.settings import answer_help, load_settings

if TYPE_CHECKING:
    from fastapi import FastAPI

    from fl_services.cloud.orchestrator import Orchestrator
    from fl_services.shared.server.app import Stopping


def create_app(settings: CloudSettings | None = None) -> FastAPI:
    # The app's modules (torch, fastapi) load here, not with this module: main() answers --help, refuses bad
    # settings and an unusable Redis without them.
    import torch

    from fl_services.cloud import retention
    from fl_services.cloud.audit import Auditor
    from fl_services.cloud.initial_state import InvalidRun
    from fl_services.cloud.metrics import CloudMetrics
    from fl_services.cloud.orchestrator import Orchestrator
    from fl_services.cloud.routes import admin, edges, health, runs, ui
    from fl_services.cloud.services import sites
    from fl_services.shared.server.app import service_app
    from fl_services.shared.server.metrics import switchable

    settings = settings or CloudSettings()
    metrics = switchable(settings.metrics, lambda: CloudMetrics(settings.long_poll_max_s))

    @asynccontextmanager
    async def lifespan(app: FastAPI):
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
                # On Python 3.11 a cancel that lands while redis-py's own wait_for completes can be lost (the
                # event channel's listener then reads on for ever): cancel what is still running until all
                # have ended.
                pending = set(tasks)
                while pending:
                    for task in pending:
                        task.cancel()
                    _, pending = await asyncio.wait(pending, timeout=0.5)
                for task in tasks:
                    with contextlib.suppress(asyncio.CancelledError):
                        await task

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


USAGE = """usage: fl-cloud

The cloud service: the control API, the dashboard (/ui/) and the edges' API over HTTP, with its state in Redis
(FL_CLOUD_REDIS_URL). Listens on FL_CLOUD_HOST:FL_CLOUD_PORT until SIGTERM or Ctrl-C."""


def main() -> None:
    answer_help(CloudSettings, USAGE)
    settings = load_settings(CloudSettings)
    configure_logging(settings.log_level, settings.log_format)
    try:
        if settings.storage == "redis":
            check_redis(settings.redis_url, settings.redis_options())
        if settings.blob_dir is not None:
            prepared_blob_files(settings.blob_dir, prefix=settings.key_prefix, orphan_s=settings.blob_orphan_s)
    except StorageRefused as exc:
        log.critical("%s; not starting", exc)
        raise SystemExit(1) from None
    from fl_services.shared.server.serve import serve
    serve(create_app(settings), settings.host, settings.port, settings.log_level, settings)


if __name__ == "__main__":
    main()
