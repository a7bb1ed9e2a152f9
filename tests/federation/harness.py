"""The whole federation in one event loop: the cloud app, L edge apps and the client processes' workers, each
talking to the next through an httpx.ASGITransport instead of a socket. No process, no port; the services'
own code runs as it does in production (lifespans, the orchestrator, the edges' round loops, the clients'
task feeds as tasks of this loop, training on each worker's own thread).

The cloud's storage is what the `storage` settings name (the `cloud_storage` fixture in conftest.py): the one
place that decides which backend the tier runs on.

Layout as in fedctl/launch.LocalTopology: client k is served by edge k mod L, each edge's clients split over
`procs_per_edge` workers (a worker is what a client process runs), every worker with its own httpx client. Or, for
runs over registered devices, `devices`: one process a device, at the edge it names, with its own data and labels
(and `Federation.join` starts one more while a run goes on).
"""
from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
from fastapi import FastAPI

from fl_services.client.config import ClientSettings
from fl_services.client.worker import Worker
from fl_services.cloud.app import create_app as create_cloud
from fl_services.cloud.config import CloudSettings
from fl_services.edge.app import create_app as create_edge
from fl_services.edge.config import EdgeSettings
from fl_services.fedctl.launch import ids_spec, split
from fl_services.shared.core.config import RunConfig
from fl_services.shared.core.reference import Device
from fl_services.shared.core.reports import RoundRecord, RunStatus
from fl_services.shared.core.tensors import Tensors, decode_tensors
from fl_services.shared.wire.admin import EdgeHealth, RunInfo
from fl_services.shared.wire.http import make_client
from tests.cloud.harness import _exit_lifespan
from tests.web import bearer

ADMIN_TOKEN = "federation-admin-token"
EDGE_TOKEN = "federation-edge-token"
CLIENT_TOKEN = "federation-client-token"
CLOUD_URL = "http://cloud"
# How often the edges report to the site registry where a test reads it. The cloud calls a site offline after three
# intervals without a report, which the stalls of a loaded machine must not reach; devices that register are
# reported within a tenth of it, so a run waiting for them is admitted as soon.
SITE_REPORT_S = 1.0


class Wire(httpx.AsyncBaseTransport):
    """An ASGI app as a peer across a network: each request is served in a task of its own, as a server's
    connection is. A caller that gives up (its task cancelled: an edge re-polling once a round ends, a client
    feed re-polling once a client joins) is released at once, whatever the handler does with the cancel it
    then gets (as at a disconnect); with httpx.ASGITransport alone the handler ran in the caller's task, and a
    cancel it lost (Python 3.11's wait_for inside redis-py) held the caller until the handler's own timeout."""

    def __init__(self, app: FastAPI):
        # An unhandled product error reaches the caller as a 500 answer, as over a socket, not as a crash.
        self.inner = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        self.serving: set[asyncio.Task[httpx.Response]] = set()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        body = await request.aread()
        served = asyncio.create_task(self._serve(httpx.Request(request.method, request.url,
                                                               headers=request.headers, content=body)))
        self.serving.add(served)
        served.add_done_callback(self.serving.discard)
        try:
            return await asyncio.shield(served)
        except asyncio.CancelledError:
            served.cancel()
            raise

    async def _serve(self, request: httpx.Request) -> httpx.Response:
        response = await self.inner.handle_async_request(request)
        return httpx.Response(response.status_code, headers=response.headers, content=await response.aread())

    async def aclose(self) -> None:
        """Ends the requests still being served (abandoned ones whose handler ignored the cancel)."""
        for task in self.serving:
            task.cancel()
        await asyncio.gather(*self.serving, return_exceptions=True)


@asynccontextmanager
async def running(app: FastAPI) -> AsyncIterator[FastAPI]:
    """The app with its lifespan entered (its background tasks start on this loop); a shutdown that hangs
    fails the test instead of stalling the suite."""
    lifespan = app.router.lifespan_context(app)
    await lifespan.__aenter__()
    try:
        yield app
    finally:
        await _exit_lifespan(lifespan)


class Admin:
    """The cloud's control API as fedctl.api.CloudAPI speaks it, asynchronously, over the in-loop cloud."""

    def __init__(self, http: httpx.AsyncClient):
        self.http = http

    async def _ok(self, response: httpx.Response) -> httpx.Response:
        assert response.status_code < 400, (response.request.method, response.request.url.path,
                                            response.status_code, response.text[:500])
        return response

    async def create_run(self, config: RunConfig) -> RunInfo:
        response = await self.http.post("/api/v1/runs", content=config.model_dump_json(),
                                        headers={"Content-Type": "application/json"})
        return RunInfo.model_validate_json((await self._ok(response)).content)

    async def run(self, run_id: str) -> RunInfo:
        return RunInfo.model_validate_json((await self._ok(await self.http.get(_run_path(run_id)))).content)

    async def runs(self) -> list[RunInfo]:
        return [RunInfo.model_validate(x) for x in (await self._ok(await self.http.get("/api/v1/runs"))).json()]

    async def action(self, run_id: str, action: str) -> RunInfo:
        response = await self.http.post(f"{_run_path(run_id)}/{action}")
        return RunInfo.model_validate_json((await self._ok(response)).content)

    async def history(self, run_id: str) -> list[RoundRecord]:
        response = await self._ok(await self.http.get(f"{_run_path(run_id)}/history"))
        return [RoundRecord.model_validate(x) for x in response.json()]

    async def model(self, run_id: str) -> Tensors:
        return decode_tensors((await self._ok(await self.http.get(f"{_run_path(run_id)}/model"))).content)

    async def wait(self, run_id: str, timeout_s: float = 300.0, poll_s: float = 0.05) -> RunInfo:
        """Polls until the run is finished or stopped."""
        deadline = time.monotonic() + timeout_s
        while True:
            info = await self.run(run_id)
            if info.status in (RunStatus.finished, RunStatus.stopped):
                return info
            assert time.monotonic() < deadline, f"run {run_id} still {info.status.value} at version {info.version}"
            await asyncio.sleep(poll_s)

    async def wait_version(self, run_id: str, at_least: int, timeout_s: float = 120.0) -> RunInfo:
        deadline = time.monotonic() + timeout_s
        while (info := await self.run(run_id)).version < at_least:
            assert time.monotonic() < deadline, f"run {run_id} stuck at version {info.version}"
            await asyncio.sleep(0.02)
        return info


def _run_path(run_id: str) -> str:
    return f"/api/v1/runs/{quote(run_id, safe='')}"


class ThreadBridge(httpx.BaseTransport):
    """A synchronous transport for a thread beside the federation's loop (fedctl's CloudAPI, as the CLI uses it):
    each request is handed to `inner` on `loop` and its answer read there."""

    def __init__(self, loop: asyncio.AbstractEventLoop, inner: httpx.AsyncBaseTransport):
        self.loop, self.inner = loop, inner

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        body = request.read()

        async def send() -> httpx.Response:
            response = await self.inner.handle_async_request(
                httpx.Request(request.method, request.url, headers=request.headers, content=body))
            return httpx.Response(response.status_code, headers=response.headers, content=await response.aread())

        return asyncio.run_coroutine_threadsafe(send(), self.loop).result()


@dataclass
class EdgeNode:
    edge_id: int
    app: FastAPI
    http: httpx.AsyncClient  # a caller of its client API (a test playing a device, /health)

    async def health(self) -> EdgeHealth:
        return EdgeHealth.model_validate_json((await self.http.get("/health")).content)


@dataclass
class ClientProcess:
    """What one `fl-client` process runs: a worker for its logical clients, over its own client of the edge."""

    name: str
    edge_id: int
    ids: list[int]
    settings: ClientSettings
    worker: Worker | None = None
    task: asyncio.Task[None] | None = None
    _http: httpx.AsyncClient | None = None

    def start(self, edge: EdgeNode) -> None:
        self._http = make_client(f"http://edge{edge.edge_id}", self.settings.token_of(self.ids[0]),
                                 self.settings.long_poll_s, transport=Wire(edge.app))
        self.worker = Worker(self.settings, self.ids, self._http)
        self.task = asyncio.create_task(self.worker.run(), name=self.name)

    async def stop(self) -> None:
        """Cancels the worker, as SIGTERM does in the process."""
        if self.task is not None:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)
        if self.worker is not None:
            await asyncio.to_thread(self.worker.executor.shutdown, True)
        if self._http is not None:
            await self._http.aclose()
        self.task = self.worker = self._http = None

    def alive(self) -> bool:
        return self.task is not None and not self.task.done()


def device_process(device: Device, workdir: Path, extra: dict[str, Any] | None = None) -> ClientProcess:
    """The `fl-client` process of one device: its id, its own data source and labels, at its edge."""
    settings = ClientSettings(**{"edge_url": f"http://edge{device.edge_id}", "clients": str(device.client_id),
                                 "client_token": CLIENT_TOKEN, "state_dir": workdir / "client-state",
                                 "data": device.data, "labels": ",".join(f"{k}={v}" for k, v in device.labels.items()),
                                 **(extra or {})})
    return ClientProcess(f"device{device.client_id}", device.edge_id, settings.hosted_ids(), settings)


@dataclass
class Federation:
    cloud: FastAPI
    admin: Admin
    edges: list[EdgeNode]
    clients: list[ClientProcess]
    num_clients: int
    workdir: Path
    cloud_settings: CloudSettings
    _cloud_http: httpx.AsyncClient

    async def join(self, device: Device) -> None:
        """Starts a device's process (it registers at its edge) and waits until its edge sees it."""
        process = device_process(device, self.workdir)
        self.clients.append(process)
        process.start(self.edges[device.edge_id])
        await self.wait_registered()

    async def _sites(self) -> list[int]:
        """The edge ids of the sites the cloud lists."""
        response = await self.cloud_request("GET", "/api/v1/sites")
        assert response.status_code == 200, response.text
        return sorted(site["edge_id"] for site in response.json())

    def cloud_bridge(self) -> ThreadBridge:
        """A synchronous transport to the cloud, for a thread (asyncio.to_thread) beside this loop."""
        return ThreadBridge(asyncio.get_running_loop(), Wire(self.cloud))

    async def cloud_request(self, method: str, url: str, token: str | None = ADMIN_TOKEN,
                            **kwargs: Any) -> httpx.Response:
        """Any request to the cloud, with `token` (the admin's by default) instead of the admin client's."""
        headers = {**bearer(token), **kwargs.pop("headers", {})}
        return await self._cloud_http.request(method, url, headers=headers, **kwargs)

    async def wait_registered(self, timeout_s: float = 60.0) -> None:
        """Until every edge sees all of its running clients, so that round 0 starts with everyone present, and
        the cloud lists every edge as a site (each registers as its loop starts, which a loaded host may not
        have reached yet), so that a run may select them."""
        deadline = time.monotonic() + timeout_s
        while True:
            expected = [sum(len(c.ids) for c in self.clients if c.edge_id == e.edge_id and c.alive())
                        for e in self.edges]
            seen = [(await e.health()).clients for e in self.edges]
            if seen == expected and await self._sites() == [e.edge_id for e in self.edges]:
                return
            for c in self.clients:
                if c.task is not None and c.task.done():
                    c.task.result()  # what ended a worker
            assert time.monotonic() < deadline, f"clients did not register in {timeout_s} s: {seen} of {expected}"
            await asyncio.sleep(0.02)


@asynccontextmanager
async def federation(storage: dict[str, Any], workdir: Path, num_clients: int, num_edges: int = 1,
                     procs_per_edge: int = 2, cloud: dict[str, Any] | None = None,
                     edge: Callable[[int], dict[str, Any]] | dict[str, Any] | None = None,
                     client: Callable[[list[int]], dict[str, Any]] | dict[str, Any] | None = None,
                     devices: list[Device] | None = None) -> AsyncIterator[Federation]:
    """A cloud on `storage`, `num_edges` edges and clients 0..num_clients-1 in `procs_per_edge` workers per
    edge, every client registered; stopped clients first, then edges, then the cloud.

    `cloud`, `edge` (or a function of the edge id giving them) and `client` (or a function of the worker's client
    ids): settings of those services on top of the topology's (what FL_CLOUD_*, FL_EDGE_* and FL_CLIENT_* set for
    the processes). `devices`: the client processes are these devices' instead of clients 0..num_clients-1.
    """
    cloud_settings = CloudSettings(**{"admin_token": ADMIN_TOKEN, "edge_token": EDGE_TOKEN, **storage,
                                      **(cloud or {})})
    cloud_app = create_cloud(cloud_settings)
    async with contextlib.AsyncExitStack() as stack:
        await stack.enter_async_context(running(cloud_app))
        cloud_http = await stack.enter_async_context(httpx.AsyncClient(
            transport=Wire(cloud_app), base_url=CLOUD_URL, timeout=60))
        admin_http = await stack.enter_async_context(httpx.AsyncClient(
            transport=Wire(cloud_app), base_url=CLOUD_URL, headers=bearer(ADMIN_TOKEN), timeout=60))
        edges = []
        for edge_id in range(num_edges):
            extra = edge(edge_id) if callable(edge) else (edge or {})
            settings = EdgeSettings(**{"edge_id": edge_id, "cloud_url": CLOUD_URL, "edge_token": EDGE_TOKEN,
                                       "client_token": CLIENT_TOKEN, "state_dir": workdir / "edge-state", **extra})
            app = create_edge(settings, cloud_transport=Wire(cloud_app))
            await stack.enter_async_context(running(app))
            http = await stack.enter_async_context(httpx.AsyncClient(
                transport=Wire(app), base_url=f"http://edge{edge_id}", timeout=60))
            edges.append(EdgeNode(edge_id, app, http))
        processes = [device_process(d, workdir) for d in devices or []]
        for node in edges if devices is None else []:
            for p, ids in enumerate(split(list(range(node.edge_id, num_clients, num_edges)), procs_per_edge)):
                settings = ClientSettings(**{"edge_url": f"http://edge{node.edge_id}", "clients": ids_spec(ids),
                                             "client_token": CLIENT_TOKEN, "state_dir": workdir / "client-state",
                                             **(client(ids) if callable(client) else client or {})})
                processes.append(ClientProcess(f"client{node.edge_id}.{p}", node.edge_id, settings.hosted_ids(),
                                               settings))
        fed = Federation(cloud_app, Admin(admin_http), edges, processes, num_clients, workdir, cloud_settings,
                         cloud_http)
        try:
            for process in processes:
                process.start(edges[process.edge_id])
            await fed.wait_registered()
            yield fed
        finally:
            for process in processes:
                await process.stop()
