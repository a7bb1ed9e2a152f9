"""An in-process edge for the endpoint tests: the app, its lifespan, a posted task, and message builders."""
from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import anyio
import httpx
import torch

from fl_services.edge.app import create_app
from fl_services.edge.config import EdgeSettings
from fl_services.edge.tasks import Task
from fl_services.fedctl.redis_server import free_port
from fl_services.shared.core.algorithms import registry
from fl_services.shared.core.config import RunConfig
from fl_services.shared.core.federation import initial_model, known_num_samples
from fl_services.shared.core.records import Record, check, flatten
from fl_services.shared.core.records import spec_of as record_spec
from fl_services.shared.core.reports import EdgeContributionHeader
from fl_services.shared.core.tensors import Tensors, decode, encode
from fl_services.shared.wire.client_edge import ClientResultHeader, ClientTaskHeader, ResultReceipt
from fl_services.shared.wire.edge_cloud import EdgeRegistration, GlobalStateHeader, SubmitReceipt
from fl_services.shared.wire.protocol import LIVE_RUNS, SAFETENSORS
from tests.web import bearer

CLIENT_TOKEN = "test-client-token"
EDGE_TOKEN = "test-edge-token"  # what this edge presents to the cloud; never valid for clients
CONFIG = RunConfig(model={"name": "logreg"}, data={"dataset": "digits", "num_clients": 4}, rounds=2)
RUN_ID = "edge-test-run"
# The body of a 202 from the result endpoint.
ACCEPTED = ResultReceipt(accepted=True).model_dump(mode="json")



def auth(token: str | None = CLIENT_TOKEN) -> dict[str, str]:
    return bearer(token)


_GLOBAL: Record | None = None


def task_record(client_id: int) -> Record:
    """What the round loop hands client `client_id` for round 0 of CONFIG."""
    global _GLOBAL
    algorithm = registry.create(CONFIG)
    if _GLOBAL is None:
        _GLOBAL = algorithm.init_global(initial_model(CONFIG))
    return algorithm.client_task(_GLOBAL, client_id, 0)


def task_tensors(client_id: int) -> Tensors:
    """That task as it travels: one flat safetensors document."""
    return flatten(task_record(client_id))


def task_id(client_id: int) -> str:
    return f"{RUN_ID}-v0-e0-c{client_id}"


class Edge:
    def __init__(self, app, http: httpx.AsyncClient):
        self.app, self.http = app, http
        self.board = app.state.board

    async def register(self, client_id: int, num_samples: int = 10) -> None:
        r = await self.http.post("/api/v1/clients", json={"client_id": client_id, "num_samples": num_samples},
                                 headers=auth())
        assert r.status_code == 200, r.text

    async def open_tasks(self, *client_ids: int) -> None:
        """Registers the clients and posts one open task each, as the round loop does."""
        tasks = []
        for k in client_ids:
            await self.register(k)
            tensors = task_record(k)
            header = ClientTaskHeader(task_id=task_id(k), run_id=RUN_ID, client_id=k, round=0, version=0,
                                      config=CONFIG)
            tasks.append(Task(header, tensors, partial(check, expected=record_spec(tensors))))
        await self.board.post(tasks)

    async def send_result(self, client_id: int, body: Any, token: str | None = CLIENT_TOKEN,
                          headers: dict[str, str] | None = None) -> httpx.Response:
        return await self.http.post(f"/api/v1/clients/{client_id}/results", content=body,
                                    headers={**auth(token), "Content-Type": SAFETENSORS, **(headers or {})})

    async def open_task(self, client_id: int) -> str | None:
        """The id of the task the client would fetch right now (None: nothing open)."""
        r = await self.http.get(f"/api/v1/clients/{client_id}/task", params={"timeout": 0}, headers=auth())
        if r.status_code == 204:
            return None
        assert r.status_code == 200, r.text
        _, header = decode(r.content, ClientTaskHeader)
        return header.task_id

    async def snapshot(self, *client_ids: int) -> dict[str, Any]:
        """Registered clients, the results received so far, and the open task of each given client."""
        return {
            "clients": dict(self.board.clients),
            "results": [(id(r), r.client_id, r.num_samples, r.loss) for r in self.board.results()],
            "open": {k: await self.open_task(k) for k in client_ids},
        }


@asynccontextmanager
async def running_edge(cloud_transport: httpx.AsyncBaseTransport | None = None, **settings: Any) -> AsyncIterator[Edge]:
    # Without a cloud_transport nothing listens on cloud_url: the round loop only retries its registration
    # in the background.
    app = create_app(EdgeSettings(**{"edge_id": 0, "cloud_url": f"http://127.0.0.1:{free_port()}",
                                     "edge_token": EDGE_TOKEN, "client_token": CLIENT_TOKEN,
                                     "long_poll_max_s": 2.0, **settings}), cloud_transport=cloud_transport)
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    lifespan = app.router.lifespan_context(app)
    await lifespan.__aenter__()
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://test", timeout=30) as http:
            yield Edge(app, http)
    finally:
        with anyio.fail_after(10):  # a shutdown that hangs fails the test instead of the whole suite
            await lifespan.__aexit__(None, None, None)




class CloudDouble:
    """The cloud's edge-facing API in-process (an httpx.MockTransport): one run whose state `version` is
    offered to any long-poll that has not got it (once `publishing`) and is not busy with it, the runs it
    knows of ended at once (any other than `run_id`), and the contributions the edges submit.

    `broken_answers` > 0: that many of the next long-polls get a body that is not a state (a failed fetch).
    """

    def __init__(self, config: RunConfig = CONFIG, run_id: str = RUN_ID) -> None:
        self.config, self.run_id, self.version = config, run_id, 0
        self.global_ = registry.create(config).init_global(initial_model(config))
        self.polls: list[int] = []  # the version of the run each long-poll says it has (-1: none), in order
        self.contributions: list[EdgeContributionHeader] = []
        self.reports: list[EdgeRegistration] = []  # the edge's registrations (site reports), in order
        self.broken_answers = 0
        self.publishing = True

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self.handle)

    async def handle(self, request: httpx.Request) -> httpx.Response:
        path, params = request.url.path, request.url.params
        if request.method == "POST" and path == "/api/v1/edges":
            self.reports.append(EdgeRegistration.model_validate_json(await request.aread()))
            return httpx.Response(200, json=self.reports[-1].model_dump(mode="json"))
        if request.method == "GET" and path.endswith("/global"):
            seen = dict(entry.rsplit(":", 1) for entry in params.get_list("seen"))
            busy = set(params.get_list("busy"))
            live = {LIVE_RUNS: self.run_id if self.publishing else ""}
            if self.run_id not in busy:
                self.polls.append(int(seen.get(self.run_id, -1)))
            if self.broken_answers > 0:
                self.broken_answers -= 1
                return httpx.Response(200, content=b"not a state")
            if (set(seen) | busy) - {self.run_id}:  # a run the edge knows has ended: at once
                return httpx.Response(204, headers=live)
            if self.publishing and self.run_id not in busy and int(seen.get(self.run_id, -1)) < self.version\
                    and (self.run_id in seen or params.get("others") != "false"):
                header = GlobalStateHeader(run_id=self.run_id, version=self.version, config=self.config)
                return httpx.Response(200, content=encode(flatten(self.global_), header), headers=live)
            await asyncio.sleep(0.05)  # a (very) short long-poll
            return httpx.Response(204, headers=live)
        if request.method == "POST" and path.endswith("/contributions"):
            _, header = decode(await request.aread(), EdgeContributionHeader)
            self.contributions.append(header)
            return httpx.Response(202, json=SubmitReceipt(accepted=True, buffered=1).model_dump())
        return httpx.Response(404, json={"detail": f"no route {request.method} {path}"})


async def serve_tasks(edge: Edge, client_ids: Iterable[int],
                      answer: Callable[[int, Tensors, ClientTaskHeader], Awaitable[None]]) -> None:
    """Clients that register, then hand every task they fetch to `answer(k, tensors, header)` (until cancelled)."""
    async def serve(k: int) -> None:
        await edge.register(k)
        while True:
            r = await edge.http.get(f"/api/v1/clients/{k}/task", params={"timeout": 1}, headers=auth())
            if r.status_code == 204:
                continue
            assert r.status_code == 200, r.text
            tensors, header = decode(r.content, ClientTaskHeader)
            await answer(k, tensors, header)

    await asyncio.gather(*(serve(k) for k in client_ids))


async def answer_tasks(edge: Edge, client_ids: Iterable[int]) -> None:
    """Clients that register, then answer every task they fetch with zeros of its shapes (until cancelled)."""
    async def answer(k: int, tensors: Tensors, header: ClientTaskHeader) -> None:
        result = ClientResultHeader(task_id=header.task_id, client_id=k, num_samples=true_samples(header.config, k),
                                    loss=0.5)
        r = await edge.send_result(k, encode(zeros_like(tensors), result))
        assert r.status_code in (202, 409), r.text

    await serve_tasks(edge, client_ids, answer)


def true_samples(config: RunConfig, client_id: int) -> int:
    """What client `client_id` truly holds where the edge knows it (it refuses another claim), else 10."""
    known = known_num_samples(config)
    return known[client_id] if known else 10


async def until(condition: Callable[[], Any], timeout: float = 10.0, what: str = "") -> None:
    """Waits for `condition()` to hold, polling; fails the test after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"still not true after {timeout} s: {what or condition}"
        await asyncio.sleep(0.02)


def result_header(client_id: int = 0, **overrides: Any) -> ClientResultHeader:
    return ClientResultHeader(**{"task_id": task_id(client_id), "client_id": client_id, "num_samples": 10,
                                 "loss": 0.5, **overrides})


def zeros_like(tensors: Tensors, dtype: torch.dtype | None = None) -> Tensors:
    return {k: torch.zeros(v.shape, dtype=dtype or v.dtype) for k, v in tensors.items()}


def result(client_id: int = 0, **header: Any) -> bytes:
    return encode(zeros_like(task_tensors(client_id)), result_header(client_id, **header))


# =================================================================================================
# Authentication
# =================================================================================================
