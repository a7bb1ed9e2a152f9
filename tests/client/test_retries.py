"""A client's writes through a passing fault of its edge (a 503, a dropped connection): the edge deduplicates
registrations and results, so the transport sends them again and the result counts once, trained once."""
from __future__ import annotations

import httpx
import pytest

from fl_services.client import worker as worker_module
from tests.client.test_worker import answered, client_of, make_task, running_worker, until
from tests.edge.harness import running_edge

pytestmark = pytest.mark.anyio


async def test_a_registration_and_an_upload_go_through_a_restarting_edge(tmp_path, monkeypatch):
    faults = {"/api/v1/clients": [httpx.ConnectError("edge restarting"), 503],
              "/api/v1/clients/0/results": [503, httpx.RemoteProtocolError("edge dropped the connection")]}
    trained = []
    real = worker_module.compute
    monkeypatch.setattr(worker_module, "compute", lambda *args: (trained.append(args[1].task_id), real(*args))[1])

    def fault(request: httpx.Request) -> httpx.Response | None:
        planned = faults.get(request.url.path) if request.method == "POST" and client_of(request) == 0 else None
        if not planned:
            return None
        answer = planned.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return httpx.Response(answer, json={"detail": "edge restarting"})

    async with running_edge() as edge:
        await edge.board.post([make_task(0)])
        async with running_worker(edge, [0], tmp_path, fault=fault) as (worker, run, double):
            await until(lambda: answered(edge) == {0}, run, timeout=20)
            assert double.count("POST", "/api/v1/clients", 503) == 1 and double.count("POST", "/api/v1/clients", 200)
            assert double.count("POST", "/api/v1/clients/0/results", 503) == 1
            assert double.count("POST", "/api/v1/clients/0/results", 202) == 1
            assert faults == {"/api/v1/clients": [], "/api/v1/clients/0/results": []}
            assert trained == [make_task(0).header.task_id] and not worker.failed and worker.completed == 1
