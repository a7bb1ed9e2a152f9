"""The edge app, which `fl-edge` (edge/main.py) serves."""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
import torch
from fastapi import FastAPI

from fl_services.edge.config import EdgeSettings
from fl_services.edge.metrics import EdgeMetrics
from fl_services.edge.round_loop import EdgeRoundLoop
from fl_services.edge.routes import clients, devices, health, secagg
from fl_services.edge.services.devices import connected_devices, offline_after_s
from fl_services.edge.tasks import ForeignClient, TaskBoard, TaskConflict, UnknownClient
from fl_services.shared.runtime import cancel_until_done
from fl_services.shared.server.app import Stopping, service_app
from fl_services.shared.server.metrics import switchable
from fl_services.shared.wire.http import make_client
from fl_services.shared.wire.tls import client_context


def create_app(settings: EdgeSettings | None = None,
               cloud_transport: httpx.AsyncBaseTransport | None = None) -> FastAPI:
    """`cloud_transport` replaces the network under the edge's client of the cloud (tests: an in-process cloud)."""
    settings = settings or EdgeSettings()
    metrics = switchable(settings.metrics, lambda: EdgeMetrics(settings.long_poll_max_s))

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        torch.set_num_threads(settings.torch_threads)
        tls = client_context(settings.cloud_ca_file, settings.cloud_cert_file, settings.cloud_key_file)
        cloud = make_client(settings.cloud_url, settings.edge_token, settings.long_poll_max_s, tls=tls,
                            **({"transport": cloud_transport} if cloud_transport is not None else {}))
        board = TaskBoard(offline_after_s(settings))
        round_loop = EdgeRoundLoop(settings, cloud, board, metrics)
        metrics.watch(clients=lambda: len(board.clients), outstanding=board.outstanding,
                      version=round_loop.version, site=settings.site_name,
                      connected=lambda: connected_devices(board=board))
        app.state.settings, app.state.board, app.state.round_loop = settings, board, round_loop
        app.state.revocations = revocations = round_loop.revocations
        tasks = [asyncio.create_task(round_loop.run_forever()), asyncio.create_task(round_loop.report_forever()),
                 asyncio.create_task(board.watch_departures(round_loop.report_batch_s())),
                 asyncio.create_task(_close_on_stop(app.state.stopping, board)),
                 asyncio.create_task(revocations.run_forever(cloud, settings.revocation_refresh_s))]
        try:
            yield
        finally:
            await cancel_until_done(tasks)
            await cloud.aclose()

    return service_app("FL edge", lifespan, settings.max_payload_bytes, [health.router, clients.router, secagg.router,
                                                                   devices.router],
                       errors={UnknownClient: 404, TaskConflict: 409, ForeignClient: 409},
                       metrics=metrics, metrics_token=settings.metrics_token, server=settings)


async def _close_on_stop(stopping: Stopping, board: TaskBoard) -> None:
    await stopping.wait()
    await board.close()

