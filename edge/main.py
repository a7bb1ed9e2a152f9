"""The edge app: `python -m edge.main`."""
from __future__ import annotations

import asyncio
import contextlib
from contextlib import asynccontextmanager

import httpx
import torch
from fastapi import FastAPI

from edge.config import EdgeSettings
from edge.metrics import EdgeMetrics
from edge.revocations import Revocations
from edge.round_loop import EdgeRoundLoop
from edge.routes import clients, health
from edge.tasks import ForeignClient, TaskBoard, TaskConflict, UnknownClient
from shared.log import configure_logging
from shared.metrics import switchable
from shared.settings import load_settings
from shared.transport.http import make_client
from shared.transport.tls import client_context
from shared.web import Stopping, serve, service_app


def create_app(settings: EdgeSettings | None = None,
               cloud_transport: httpx.AsyncBaseTransport | None = None) -> FastAPI:
    """`cloud_transport` replaces the network under the edge's client of the cloud (tests: an in-process cloud)."""
    settings = settings or EdgeSettings()
    metrics = switchable(settings.metrics, lambda: EdgeMetrics(settings.long_poll_max_s))

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        torch.set_num_threads(settings.torch_threads)
        tls = client_context(settings.cloud_ca_file, settings.cloud_cert_file, settings.cloud_key_file)
        cloud = make_client(settings.cloud_url, settings.edge_token, settings.long_poll_max_s, tls=tls,
                            **({"transport": cloud_transport} if cloud_transport is not None else {}))
        board = TaskBoard()
        round_loop = EdgeRoundLoop(settings, cloud, board, metrics)
        metrics.watch(board, round_loop)
        app.state.settings, app.state.board, app.state.round_loop = settings, board, round_loop
        app.state.revocations = revocations = Revocations()
        tasks = [asyncio.create_task(round_loop.run_forever()),
                 asyncio.create_task(_close_on_stop(app.state.stopping, board)),
                 asyncio.create_task(revocations.run_forever(cloud, settings.revocation_refresh_s))]
        try:
            yield
        finally:
            for task in tasks:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            await cloud.aclose()

    return service_app("FL edge", lifespan, settings.max_payload_bytes, [health.router, clients.router],
                       errors={UnknownClient: 404, TaskConflict: 409, ForeignClient: 409},
                       metrics=metrics, metrics_token=settings.metrics_token, server=settings)


async def _close_on_stop(stopping: Stopping, board: TaskBoard) -> None:
    await stopping.wait()
    await board.close()


def main() -> None:
    settings = load_settings(EdgeSettings)
    configure_logging(settings.log_level, settings.log_format, edge_id=settings.edge_id)
    serve(create_app(settings), settings.host, settings.port, settings.log_level, settings)


if __name__ == "__main__":
    main()
