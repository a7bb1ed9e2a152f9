"""One process, many logical clients: each pulls its tasks by long-poll; training runs one at a time.

Local training goes through a single worker thread, so a process never uses more cores than its
torch thread setting, however many logical clients it hosts.
"""
from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor

import httpx

from client.config import ClientSettings
from client.state import ClientStateStore
from shared.algorithms import registry
from shared.config import RunConfig
from shared.data.datasets import load_client
from shared.federation import local_job
from shared.schemas import ClientRegistration, ClientResultHeader, ClientTaskHeader
from shared.transport.http import binary_body, send
from shared.transport.tensors import Tensors, decode, encode

log = logging.getLogger("client.worker")


def compute(settings: ClientSettings, header: ClientTaskHeader, task: Tensors) -> bytes:
    """Runs the algorithm's local update for one task and returns the result message, state saved."""
    store = ClientStateStore(settings.state_dir, header.run_id, header.client_id)
    saved = store.saved_result(header.task_id)
    if saved is not None:  # we crashed after training but before the upload was acknowledged
        return saved
    config = _local_config(settings, header.config)
    algorithm = registry.create(config)
    data = load_client(config.data, config.seed, header.client_id)
    update = algorithm.local_update(local_job(config, header.client_id, header.round, data), task, store.load())
    result = ClientResultHeader(task_id=header.task_id, client_id=header.client_id,
                                num_samples=update.num_samples, loss=update.loss, metrics=update.metrics)
    blob = encode(update.tensors, result)
    store.save(header.task_id, update.state, blob)
    return blob


def _local_config(settings: ClientSettings, config: RunConfig) -> RunConfig:
    if settings.data_path and config.data.dataset == "npz":
        data = config.data.model_copy(update={"path": settings.data_path})
        return config.model_copy(update={"data": data})
    return config


class Worker:
    def __init__(self, settings: ClientSettings, client_ids: list[int], edge: httpx.AsyncClient):
        self.settings = settings
        self.client_ids = client_ids
        self.edge = edge
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="train")
        self.completed = 0
        # Tasks whose training raised (e.g. diverged to NaN): the same inputs would fail again, so
        # they are not retried; the edge treats the client as dropped for that round.
        self.failed: set[str] = set()

    async def run(self) -> None:
        await asyncio.gather(*(self.serve(k) for k in self.client_ids))

    async def register(self, client_id: int) -> None:
        reg = ClientRegistration(client_id=client_id, capabilities={"torch_threads": self.settings.torch_threads})
        response = await send(self.edge, "POST", "/api/v1/clients", json=reg.model_dump())
        response.raise_for_status()

    async def serve(self, client_id: int) -> None:
        await self.register(client_id)
        while True:
            response = await send(self.edge, "GET", f"/api/v1/clients/{client_id}/task",
                                  params={"timeout": self.settings.long_poll_s})
            if response.status_code == 204:
                continue
            if response.status_code == 404:  # the edge restarted and forgot us
                await self.register(client_id)
                continue
            response.raise_for_status()
            task, header = decode(response.content, ClientTaskHeader)
            if header.task_id in self.failed:
                await asyncio.sleep(1.0)  # still open at the edge until its deadline; do not spin
                continue
            loop = asyncio.get_running_loop()
            try:
                blob = await loop.run_in_executor(self.executor, compute, self.settings, header, task)
            except Exception:
                log.exception("client %d: task %s failed; skipping it", client_id, header.task_id)
                self.failed.add(header.task_id)
                continue
            await self.upload(client_id, header, blob)

    async def upload(self, client_id: int, header: ClientTaskHeader, blob: bytes) -> None:
        response = await send(self.edge, "POST", f"/api/v1/clients/{client_id}/results", **binary_body(blob))
        if response.status_code == 409:
            # Already accepted (a retried upload) or the round moved on: nothing left to do either way.
            log.info("client %d: task %s: %s", client_id, header.task_id, response.json().get("detail"))
        elif response.status_code >= 400:
            log.error("client %d: edge refused task %s: %s %s", client_id, header.task_id,
                      response.status_code, response.text[:300])
        else:
            self.completed += 1
