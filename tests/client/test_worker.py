"""One process, many logical clients: one client's failure stays its own.

The worker talks to a real edge app in-process (httpx.ASGITransport under the worker's own httpx client,
built by `make_client` as in client/main.py); `EdgeDouble` can answer chosen requests itself (a fault)
and records every answer. Tasks are put on the edge's board directly, as its round loop would.
"""
from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from fl_services.client import worker as worker_module
from fl_services.client.config import ClientSettings
from fl_services.client.feed import ClientsStopped, TaskFeed
from fl_services.client.worker import Worker
from fl_services.edge.tasks import Task
from fl_services.shared.core.config import RunConfig
from fl_services.shared.core.records import check, spec_of
from fl_services.shared.core.tensors import InvalidContent
from fl_services.shared.wire.client_edge import ClientTaskHeader
from fl_services.shared.wire.http import make_client
from fl_services.shared.wire.protocol import LIVE_RUNS, client_token, issue_device_tokens
from tests.edge.harness import CLIENT_TOKEN, CONFIG, RUN_ID, Edge, running_edge, task_record

pytestmark = pytest.mark.anyio

FAST = {"long_poll_s": 0.5, "retry_initial_s": 0.01, "retry_max_s": 0.05}
Fault = Callable[[httpx.Request], "httpx.Response | None"]


class EdgeDouble(httpx.AsyncBaseTransport):
    """The in-process edge, except for the requests `fault` answers itself; records (method, path, status)."""

    def __init__(self, app: Any, fault: Fault | None = None):
        self.inner = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        self.fault = fault
        self.answers: list[tuple[str, str, int]] = []
        self.requests: list[httpx.Request] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        response = self.fault(request) if self.fault else None
        if response is None:
            response = await self.inner.handle_async_request(request)
        self.answers.append((request.method, request.url.path, response.status_code))
        return response

    def count(self, method: str, path: str, status: int | None = None) -> int:
        return sum(1 for m, p, s in self.answers if m == method and p == path and status in (None, s))


def client_of(request: httpx.Request) -> int | None:
    """The logical client a request is for: from the URL, or from a registration's body."""
    parts = request.url.path.split("/")
    if len(parts) > 4 and parts[3] == "clients" and parts[4].isdigit():
        return int(parts[4])
    if request.method == "POST" and request.url.path == "/api/v1/clients":
        return json.loads(request.content)["client_id"]
    return None


def make_task(client_id: int, round_: int = 0, blob: bytes | None = None, config: RunConfig = CONFIG) -> Task:
    tensors = task_record(client_id)
    header = ClientTaskHeader(task_id=f"{RUN_ID}-v{round_}-e0-c{client_id}", run_id=RUN_ID, client_id=client_id,
                              round=round_, version=round_, config=config)
    return Task(header, tensors, partial(check, expected=spec_of(tensors)), _blob=blob)


def answered(edge: Edge) -> set[int]:
    return {r.client_id for r in edge.board.results()}


@asynccontextmanager
async def running_worker(edge: Edge, ids: list[int], state_dir: Path, token: str = CLIENT_TOKEN,
                         fault: Fault | None = None, bundles: bool | None = None, **settings: Any
                         ) -> AsyncIterator[tuple[Worker, asyncio.Task, EdgeDouble]]:
    """`bundles`: whether its clients' results go up in result bundles (None: as the worker decides)."""
    config = ClientSettings(**{"client_token": token, "state_dir": state_dir, **FAST, **settings})
    double = EdgeDouble(edge.app, fault)
    async with make_client("http://edge", token, config.long_poll_s, transport=double) as http:
        worker = Worker(config, ids, http)
        if bundles is not None:
            worker.bundles = bundles
        run = asyncio.create_task(worker.run())
        try:
            yield worker, run, double
        finally:
            run.cancel()
            await asyncio.gather(run, return_exceptions=True)
            worker.executor.shutdown(wait=True)


async def until(condition: Callable[[], bool], run: asyncio.Task, timeout: float = 30.0) -> None:
    """Waits for `condition`; fails at once with whatever ended the worker, if it ended."""
    with anyio.fail_after(timeout):
        while True:
            if run.done():
                run.result()  # raises what killed every logical client
                raise AssertionError("the worker returned")
            if condition():
                return
            await asyncio.sleep(0.01)


async def test_a_malformed_task_for_one_client_spares_the_other_and_it_recovers(tmp_path):
    async with running_edge() as edge:
        await edge.board.post([make_task(0, blob=b"this is not a safetensors document"), make_task(1)])
        async with running_worker(edge, [0, 1], tmp_path) as (worker, run, double):
            # Client 1 completes its task; client 0 reports its malformed task as failed, and does not fetch
            # it again (the same bytes would fail again).
            await until(lambda: answered(edge) == {1} and edge.board.failures(), run)
            assert [f.client_id for f in edge.board.failures()] == [0]
            assert "PayloadError" in edge.board.failures()[0].error
            assert make_task(0).header.task_id in worker.failed
            await edge.board.post([make_task(0, round_=1), make_task(1, round_=1)])  # the next round: good tasks
            await until(lambda: answered(edge) == {0, 1}, run)
            assert double.count("POST", "/api/v1/clients/0/failures") == 1


async def test_a_result_the_edge_refuses_is_reported_as_the_tasks_failure(tmp_path):
    """The round waited for the client until its deadline: the refused result was only remembered."""
    def refuse(request: httpx.Request) -> httpx.Response | None:
        if request.url.path == "/api/v1/clients/0/results":
            return httpx.Response(422, json={"detail": "update beyond the bounds"})
        return None

    async with running_edge() as edge:
        await edge.board.post([make_task(0), make_task(1)])
        async with running_worker(edge, [0, 1], tmp_path, fault=refuse, bundles=False) as (worker, run, double):
            await until(lambda: answered(edge) == {1} and edge.board.failures(), run)
            [failure] = edge.board.failures()
            assert failure.client_id == 0 and "422 update beyond the bounds" in failure.error
            assert make_task(0).header.task_id in worker.failed
            assert double.count("POST", "/api/v1/clients/0/results") == 1  # not re-sent


async def test_one_long_poll_serves_every_logical_client_of_the_process(tmp_path):
    ids = list(range(4))
    async with running_edge() as edge:
        async with running_worker(edge, ids, tmp_path) as (_, run, double):
            await until(lambda: len(edge.board.clients) == 4, run)
            await edge.board.post([make_task(k) for k in ids])
            await until(lambda: answered(edge) == set(ids), run)
            assert double.count("GET", "/api/v1/clients/0/task") == 0
            # One bundle brought the four tasks (the later polls held them, and then had nothing to bring).
            assert double.count("POST", "/api/v1/clients/tasks", 200) == 1


async def test_a_refused_registration_is_retried_while_the_other_client_works(tmp_path):
    refusals = []

    def fault(request: httpx.Request) -> httpx.Response | None:
        if request.url.path == "/api/v1/clients" and client_of(request) == 0 and len(refusals) < 3:
            refusals.append(request)
            return httpx.Response(400, json={"detail": "edge not ready"})
        return None

    async with running_edge() as edge:
        await edge.board.post([make_task(0), make_task(1)])
        async with running_worker(edge, [0, 1], tmp_path, fault=fault) as (_, run, _double):
            await until(lambda: answered(edge) == {0, 1}, run)
            assert len(refusals) == 3


async def test_training_that_raises_for_one_client_spares_the_other_and_it_recovers(tmp_path, monkeypatch):
    real = worker_module.compute

    def compute(settings, header, task, models=None):
        if header.client_id == 0 and header.round == 0:
            raise RuntimeError("local update diverged")
        return real(settings, header, task, models)

    monkeypatch.setattr(worker_module, "compute", compute)
    async with running_edge() as edge:
        await edge.board.post([make_task(0), make_task(1)])
        async with running_worker(edge, [0, 1], tmp_path) as (worker, run, _):
            # Client 0 reports why to the edge, which records it for the round's history.
            await until(lambda: answered(edge) == {1} and edge.board.failures(), run)
            assert make_task(0).header.task_id in worker.failed
            reported = [(f.client_id, f.error) for f in edge.board.failures()]
            assert reported == [(0, "RuntimeError: local update diverged")]
            await edge.board.post([make_task(0, round_=1), make_task(1, round_=1)])
            await until(lambda: answered(edge) == {0, 1}, run)


async def test_an_edge_that_forgot_its_clients_gets_them_registered_again(tmp_path):
    async with running_edge() as edge:
        await edge.board.post([make_task(0), make_task(1)])
        async with running_worker(edge, [0, 1], tmp_path) as (_, run, double):
            await until(lambda: answered(edge) == {0, 1}, run)
            edge.board.clients.clear()  # as after a restart of the edge
            await edge.board.post([make_task(0, round_=1), make_task(1, round_=1)])
            await until(lambda: answered(edge) == {0, 1}, run)
            assert double.count("POST", "/api/v1/clients", 200) == 4


async def test_a_refused_token_stops_only_that_client(tmp_path, caplog):
    def fault(request: httpx.Request) -> httpx.Response | None:
        if request.method == "POST" and request.url.path == "/api/v1/clients" and client_of(request) == 0:
            return httpx.Response(401, json={"detail": "invalid bearer token"})
        return None

    async with running_edge() as edge:
        await edge.board.post([make_task(0), make_task(1)])
        async with running_worker(edge, [0, 1], tmp_path, fault=fault) as (worker, run, double):
            await until(lambda: answered(edge) == {1} and set(worker.stopped) == {0}, run)
            await edge.board.post([make_task(0, round_=1), make_task(1, round_=1)])
            await until(lambda: answered(edge) == {1}, run)  # client 1 goes on serving
            await asyncio.sleep(0.1)
            assert not run.done()
            assert all(0 not in json.loads(r.content)["client_ids"] for r in double.requests
                       if r.url.path == "/api/v1/clients/tasks")  # client 0 is never polled for
    assert "client 0: stopped for good" in caplog.text and "401" in caplog.text


async def test_a_refused_poll_stops_every_client_it_asked_for(tmp_path):
    def fault(request: httpx.Request) -> httpx.Response | None:
        if request.url.path == "/api/v1/clients/tasks":
            return httpx.Response(401, json={"detail": "invalid bearer token"})
        return None

    async with running_edge() as edge:
        async with running_worker(edge, [0, 1], tmp_path, fault=fault) as (worker, run, _):
            with anyio.fail_after(4), pytest.raises(ClientsStopped):
                await run
            assert set(worker.stopped) == {0, 1}


async def test_when_every_client_is_refused_the_worker_raises(tmp_path):
    async with running_edge() as edge:
        async with running_worker(edge, [0, 1], tmp_path, token="wrong-token") as (worker, run, _):
            with anyio.fail_after(4), pytest.raises(RuntimeError, match="every logical client") as info:
                await run
    assert isinstance(info.value, ClientsStopped)
    assert set(worker.stopped) == {0, 1} and "client 0" in str(info.value) and "client 1" in str(info.value)


async def test_cancellation_stops_every_client_at_once_even_while_one_backs_off(tmp_path):
    def fault(request: httpx.Request) -> httpx.Response | None:
        if request.method == "POST" and request.url.path == "/api/v1/clients" and client_of(request) == 0:
            return httpx.Response(400, json={"detail": "edge not ready"})
        return None

    async with running_edge() as edge:
        async with running_worker(edge, [0, 1], tmp_path, fault=fault, retry_initial_s=30, retry_max_s=30
                                  ) as (_, run, double):
            # Client 0's registration waits 30 s after its refusal; client 1 waits in a long-poll.
            await until(lambda: double.count("POST", "/api/v1/clients", 400) == 1
                        and double.count("POST", "/api/v1/clients", 200) == 1, run)
            await asyncio.sleep(0.1)
            run.cancel()
            with anyio.fail_after(1), pytest.raises(asyncio.CancelledError):
                await run


async def test_a_device_with_its_own_token_serves_its_client_only(tmp_path):
    """Given client_token(secret, 0), a worker serves client 0; as client 1 the edge refuses it (401)."""
    async with running_edge() as edge:
        await edge.board.post([make_task(0), make_task(1)])
        async with running_worker(edge, [0, 1], tmp_path, token=client_token(CLIENT_TOKEN, 0)) as (worker, run, _):
            await until(lambda: answered(edge) == {0} and set(worker.stopped) == {1}, run)


async def test_a_process_with_a_token_per_client_serves_them_all_and_a_revoked_one_stops_alone(tmp_path):
    """client_tokens: each logical client speaks with its own issued token (the process holds no secret);
    when the edge lists client 1's token as revoked, client 1 stops and clients 0 and 2 go on."""
    tokens = issue_device_tokens(CLIENT_TOKEN, [0, 1, 2])
    async with running_edge() as edge:
        await edge.board.post([make_task(k) for k in (0, 1, 2)])
        async with running_worker(edge, [0, 1, 2], tmp_path, token="not-the-secret",
                                  client_tokens=tokens) as (worker, run, double):
            await until(lambda: answered(edge) == {0, 1, 2}, run)
            edge.app.state.revocations.ids = frozenset({tokens[1].split(".")[2]})  # what a refresh would bring
            await edge.board.post([make_task(k, round_=1) for k in (0, 1, 2)])
            await until(lambda: set(worker.stopped) == {1} and worker.completed == 5, run)
            assert "revoked" in worker.stopped[1]
            # The poll names client 1 as refused (X-FL-Refused-Clients) and serves the others; no request of
            # clients 0 and 2 is ever refused.
            refused = [path for _, path, status in double.answers if status == 401]
            assert all(path.startswith("/api/v1/clients/1/") for path in refused), refused
            polls = [r for r in double.requests if r.url.path == "/api/v1/clients/tasks"]
            assert all(json.loads(r.content)["tokens"] == {str(k): tokens[k] for k in json.loads(r.content)
                                                           ["client_ids"]} for r in polls)
            assert not run.done()


async def test_the_results_of_many_clients_go_up_together_in_result_bundles(tmp_path):
    """While the training thread has more of the process's tasks, their results wait for each other: a few
    requests carry them all (one per result before), and each counts once."""
    ids = list(range(4))
    async with running_edge() as edge:
        await edge.board.post([make_task(k) for k in ids])
        async with running_worker(edge, ids, tmp_path) as (worker, run, double):
            assert worker.bundles
            await until(lambda: answered(edge) == set(ids) and worker.completed == len(ids), run)
            singles = sum(double.count("POST", f"/api/v1/clients/{k}/results") for k in ids)
            bundles = double.count("POST", "/api/v1/clients/results", 200)
            assert bundles >= 1 and singles + bundles < len(ids), (singles, bundles)
            assert not worker.failed


async def test_a_result_refused_within_a_bundle_is_that_tasks_failure_alone(tmp_path):
    """The edge takes a bundle's results one by one: client 0's result, refused (422), is reported as its task's
    failure and not sent again; the other clients' results of the same bundle are accepted."""
    def refuse(tensors: Any) -> None:
        raise InvalidContent("tensor 'w' has values beyond ±1e+06")

    ids = list(range(4))
    async with running_edge() as edge:
        tasks = [make_task(k) for k in ids]
        tasks[0].check = refuse
        await edge.board.post(tasks)
        async with running_worker(edge, ids, tmp_path) as (worker, run, double):
            await until(lambda: answered(edge) == {1, 2, 3} and edge.board.failures(), run)
            [failure] = edge.board.failures()
            assert failure.client_id == 0 and "422 tensor 'w' has values beyond" in failure.error
            assert make_task(0).header.task_id in worker.failed and worker.completed == 3
            sent = double.count("POST", "/api/v1/clients/results") + double.count("POST", "/api/v1/clients/0/results")
            await asyncio.sleep(0.5)
            assert double.count("POST", "/api/v1/clients/results") + double.count(
                "POST", "/api/v1/clients/0/results") == sent  # not re-sent
            assert double.count("POST", "/api/v1/clients/results", 200) >= 1


async def test_an_edge_without_result_bundles_gets_each_result_on_its_own(tmp_path):
    """An edge that predates result bundles answers their route 404: the process sends every result on its own
    from then on, and every one counts."""
    def old_edge(request: httpx.Request) -> httpx.Response | None:
        if request.url.path == "/api/v1/clients/results":
            return httpx.Response(404, json={"detail": "Not Found"})
        return None

    ids = list(range(4))
    async with running_edge() as edge:
        await edge.board.post([make_task(k) for k in ids])
        async with running_worker(edge, ids, tmp_path, fault=old_edge) as (worker, run, double):
            await until(lambda: answered(edge) == set(ids) and worker.completed == len(ids), run)
            assert not worker.bundles and double.count("POST", "/api/v1/clients/results") == 1
            assert sum(double.count("POST", f"/api/v1/clients/{k}/results", 202) for k in ids) == len(ids)


async def test_a_refused_result_is_not_sent_again_and_again(tmp_path):
    """A 422 for a result (say, values beyond the edge's bounds) would be the same for the same result:
    the client drops that task instead of re-sending it in a tight loop (208 uploads in 2 s, once)."""
    def fault(request: httpx.Request) -> httpx.Response | None:
        if request.method == "POST" and request.url.path == "/api/v1/clients/0/results":
            return httpx.Response(422, json={"detail": "tensor 'w' has values beyond ±1e+06"})
        return None

    async with running_edge() as edge:
        await edge.board.post([make_task(0), make_task(1)])
        async with running_worker(edge, [0, 1], tmp_path, fault=fault, bundles=False) as (_, run, double):
            await until(lambda: answered(edge) == {1} and double.count("POST", "/api/v1/clients/0/results") >= 1, run)
            await asyncio.sleep(1.0)
            assert double.count("POST", "/api/v1/clients/0/results") == 1
            assert not run.done()


async def test_its_clients_state_of_runs_the_edge_no_longer_names_live_is_deleted(tmp_path):
    """It stayed on the device for good, even after the run's deletion. Only this process's clients' state
    goes: another process may share the state directory."""
    for run_id, k in (("ended", 0), ("ended", 9), ("live", 0)):
        (tmp_path / run_id / f"client-{k}").mkdir(parents=True)
        (tmp_path / run_id / f"client-{k}" / "state.safetensors").write_bytes(b"state")
    named: list[str | None] = [None]  # what the edge names live: nothing until it has heard from the cloud

    def live_runs(request: httpx.Request) -> httpx.Response | None:
        if request.url.path == "/api/v1/clients/tasks":
            return httpx.Response(204, headers={} if named[0] is None else {LIVE_RUNS: named[0]})
        return None

    async with running_edge() as edge:
        async with running_worker(edge, [0, 1], tmp_path, fault=live_runs) as (_, run, double):
            await until(lambda: double.count("POST", "/api/v1/clients/tasks") >= 2, run)
            assert (tmp_path / "ended" / "client-0").exists()  # no list: nothing is deleted
            named[0] = "live"
            polls = double.count("POST", "/api/v1/clients/tasks")
            await until(lambda: double.count("POST", "/api/v1/clients/tasks") > polls, run)
            await until(lambda: not (tmp_path / "ended" / "client-0").exists(), run)
    assert (tmp_path / "ended" / "client-9" / "state.safetensors").exists()  # another process's client
    assert (tmp_path / "live" / "client-0" / "state.safetensors").exists()


async def test_an_emulated_hold_ends_with_its_run(tmp_path):
    """With dvfs.time_scale 1,000 (allowed) a result was held ~1,000 s, its run stopped or not."""
    live = [RUN_ID]

    def live_runs(request: httpx.Request) -> httpx.Response | None:
        if request.url.path == "/api/v1/clients/tasks" and not live:
            return httpx.Response(204, headers={LIVE_RUNS: ""})
        return None

    slow = CONFIG.model_copy(update={"dvfs": CONFIG.dvfs.model_copy(update={"time_scale": 1000.0})})
    async with running_edge() as edge:
        edge.app.state.round_loop._live = {RUN_ID}  # as if the cloud had named the run live
        await edge.board.post([make_task(0, config=slow)])
        async with running_worker(edge, [0], tmp_path, fault=live_runs,
                                  dvfs_backend="emulate") as (worker, run, double):
            await until(lambda: bool(worker._handling), run)
            await asyncio.sleep(1.0)  # trained (ms), now held; had it ended during training, no hold at all
            live.clear()  # the run is stopped
            await until(lambda: not worker._handling, run, timeout=10)
            assert double.count("POST", "/api/v1/clients/0/results") == 0


async def test_a_held_task_posted_again_is_fetched_again_once_released_not_a_long_poll_later(tmp_path):
    """A failed round runs again with the same task ids while the process still holds one (a secure round's device
    waiting out its phase): once it lets go of the task, the feed asks again at once for the task posted again."""
    delivered: list[str] = []
    config = ClientSettings(client_token=CLIENT_TOKEN, state_dir=tmp_path, **{**FAST, "long_poll_s": 60})
    async with running_edge() as edge:
        async with make_client("http://edge", CLIENT_TOKEN, config.long_poll_s,
                               transport=EdgeDouble(edge.app)) as http:
            feed = TaskFeed(config, http, [0], lambda item: delivered.append(item.task_id))
            run = asyncio.create_task(feed.run())
            try:
                await until(lambda: 0 in edge.board.clients, run)
                await edge.board.post([make_task(0)])
                await until(lambda: len(delivered) == 1, run)
                await edge.board.post([make_task(0)])  # the round run again while the task is held
                await asyncio.sleep(0.2)
                assert len(delivered) == 1  # not handed to the clients twice at once
                feed.release(delivered[0])
                await until(lambda: len(delivered) == 2, run, timeout=10)
                assert delivered[1] == delivered[0]
            finally:
                run.cancel()
                await asyncio.gather(run, return_exceptions=True)
