"""The cloud app: `python -m cloud.main` (under bare uvicorn: `uvicorn cloud.main:create_app --factory
--timeout-graceful-shutdown 1`, or a stop waits for the open long-polls)."""
from __future__ import annotations

import asyncio
import contextlib
import logging
from contextlib import asynccontextmanager

import redis.asyncio as aioredis
import torch
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from cloud.config import CloudSettings
from cloud.keys import Keys
from cloud.orchestrator import Orchestrator
from cloud.routes import edges, health, runs
from cloud.store import Conflict, NotFound, Store
from shared.web import BodyLimit, Stopping, serve


def create_app(settings: CloudSettings | None = None) -> FastAPI:
    settings = settings or CloudSettings()

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        torch.set_num_threads(settings.torch_threads)
        app.state.stopping.bind()
        redis = aioredis.Redis.from_url(settings.redis_url)
        store = Store(redis, Keys(settings.key_prefix))
        orchestrator = Orchestrator(store)
        app.state.settings, app.state.store, app.state.orchestrator = settings, store, orchestrator
        loop_task = asyncio.create_task(orchestrator.run_forever())
        try:
            yield
        finally:
            orchestrator.stop()
            loop_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await loop_task
            await redis.aclose()

    app = FastAPI(title="FL cloud", version="0.1.0", lifespan=lifespan)
    app.state.stopping = Stopping()
    app.add_middleware(BodyLimit, limit=settings.max_payload_bytes)
    app.include_router(health.router)
    app.include_router(runs.router)
    app.include_router(edges.router)

    @app.exception_handler(NotFound)
    async def not_found(_: Request, exc: NotFound):
        return JSONResponse({"detail": str(exc)}, status_code=404)

    @app.exception_handler(Conflict)
    async def conflict(_: Request, exc: Conflict):
        return JSONResponse({"detail": str(exc)}, status_code=409)

    return app


def main() -> None:
    settings = CloudSettings()
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s cloud %(levelname)s %(message)s")
    serve(create_app(settings), settings.host, settings.port, settings.log_level)


if __name__ == "__main__":
    main()
