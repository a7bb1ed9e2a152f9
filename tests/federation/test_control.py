"""Control and failures through the services: pause/resume, clients that drop out, a run stopped mid-round.
(A killed cloud and services stopped by SIGTERM: tests/integration/test_resilience.py, with real processes.)"""
import asyncio
import time

import pytest

from fl_services.client import worker
from fl_services.fedctl.display import failures
from fl_services.shared.core.config import RunConfig
from fl_services.shared.core.reports import RunStatus
from fl_services.shared.wire.admin import RunSites
from tests.federation.harness import federation
from tests.prometheus import samples, value

pytestmark = pytest.mark.anyio

# Small and quick, but with E=2, minibatches and partial participation.
CONFIG = dict(model={"name": "mlp"}, data={"dataset": "digits", "num_clients": 6},
              local={"epochs": 2, "batch_size": 16, "lr": 0.1}, fraction=0.5)


async def test_pause_holds_the_version_and_resume_finishes(cloud_storage, tmp_path):
    """A pause holds the version from its answer until the resume (docs/decisions/pause-holds-the-version.md):
    the round the edge trains at the pause still ends, its contribution is accepted and kept in the buffer, and
    the resume applies it. Waits on what the services show (the edge's round, the buffer), never on time."""
    config = RunConfig(name="pause", rounds=6, **CONFIG)
    async with federation(cloud_storage, tmp_path, num_clients=6) as fed:
        admin, edge, orchestrator = fed.admin, fed.edges[0], fed.cloud.state.orchestrator
        run_id = (await admin.create_run(config)).run_id
        await admin.action(run_id, "start")
        await admin.wait_version(run_id, 1)
        while True:
            paused = await admin.action(run_id, "pause")
            assert paused.status == RunStatus.paused
            held = paused.version
            if (await edge.health()).version == held:  # it trains (or trained) on the held version
                break
            # Paused between a version and the edge's fetch of it: nothing in flight to hold; the next one.
            assert held < config.rounds - 1, "the edge never trained on the version a pause held"
            await admin.action(run_id, "resume")
            await admin.wait_version(run_id, held + 1)
        # Its contribution arrives during the pause, and stays: the cloud applies no update to a paused run.
        await until(lambda: admin.run(run_id),
                    lambda info: info.buffered >= config.topology.buffer_size or info.version != held, 120,
                    "the contribution of the round in flight at the pause is accepted")
        assert await orchestrator.update(run_id) is False
        info = await admin.run(run_id)
        assert (info.status, info.version) == (RunStatus.paused, held)
        await admin.action(run_id, "resume")
        final = await admin.wait(run_id, timeout_s=120)
        history = await admin.history(run_id)
    assert final.status == RunStatus.finished and final.version == config.rounds
    assert [h.version for h in history] == list(range(1, config.rounds + 1))  # none lost, none twice


async def test_dropped_clients_round_continues_with_the_quorum(cloud_storage, tmp_path):
    config = RunConfig(name="dropout", rounds=2, **{**CONFIG, "fraction": 1.0},
                       policy={"deadline_s": 2.0, "min_fraction": 0.5})
    async with federation(cloud_storage, tmp_path, num_clients=6) as fed:
        gone = fed.clients[1]
        assert gone.ids == [1, 3, 5]  # the second worker of edge 0
        await gone.stop()
        run_id = (await fed.admin.create_run(config)).run_id
        await fed.admin.action(run_id, "start")
        final = await fed.admin.wait(run_id, timeout_s=120)
        history = await fed.admin.history(run_id)
    assert final.status == RunStatus.finished
    for h in history:
        assert {c.client_id for c in h.clients} == {0, 2, 4}


async def test_stopping_a_run_releases_its_edge_at_once_and_the_next_run_trains(cloud_storage, tmp_path):
    """A run stopped mid-round (its edge waiting, with a 10-minute deadline, for two clients that never come)
    releases the edge within seconds, and the next run trains."""
    small = dict(model={"name": "logreg"}, rounds=2)
    async with federation(cloud_storage, tmp_path, num_clients=2, procs_per_edge=1) as fed:
        admin, edge = fed.admin, fed.edges[0]
        stuck = RunConfig(name="stuck", data={"dataset": "digits", "num_clients": 4},
                          policy={"deadline_s": 600, "min_fraction": 1.0}, **small)
        run_id = (await admin.create_run(stuck)).run_id
        await admin.action(run_id, "start")
        await until(lambda: edge.health(), lambda h: h.run_id == run_id, 60, "the edge starts the stuck run's round")
        board = edge.app.state.board
        await until(lambda: _async(len(board.results(run_id))), lambda n: n == 2, 60,
                    "its two clients answer (the other two never will)")
        await admin.action(run_id, "stop")
        # Released by the stop, not by the round's 600 s deadline: far sooner than that, however slow the machine.
        await until(lambda: edge.health(), lambda h: h.run_id is None, 120, "the edge drops the stopped run")
        following = await admin.create_run(RunConfig(name="next", data={"dataset": "digits", "num_clients": 2},
                                                     **small))
        await admin.action(following.run_id, "start")
        final = await admin.wait(following.run_id, timeout_s=120)
    assert final.status == RunStatus.finished and final.version == 2


async def _async(value):
    return value


async def until(read, condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition(await read()):
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}"
        await asyncio.sleep(0.05)


def failing_for(monkeypatch, client_ids: set[int] | None) -> None:
    """Clients `client_ids` (None: every one) cannot train: their environment lacks the run's model package."""
    train = worker.compute

    def compute(settings, header, task, models=None):
        if client_ids is None or header.client_id in client_ids:
            raise ModuleNotFoundError("No module named 'lab_models'")
        return train(settings, header, task, models)

    monkeypatch.setattr(worker, "compute", compute)


async def scrape(http) -> dict:
    r = await http.get("/metrics")
    assert r.status_code == 200, r.text
    return samples(r.text)


async def test_a_failed_device_is_in_the_history_the_metrics_and_fedctl_with_its_kind(cloud_storage, tmp_path,
                                                                                      monkeypatch):
    failing_for(monkeypatch, {1})
    config = RunConfig(name="one-fails", rounds=2, model={"name": "logreg"},
                       data={"dataset": "digits", "num_clients": 4})
    async with federation(cloud_storage, tmp_path, num_clients=4, procs_per_edge=1) as fed:
        run_id = (await fed.admin.create_run(config)).run_id
        await fed.admin.action(run_id, "start")
        final = await fed.admin.wait(run_id, timeout_s=120)
        history = await fed.admin.history(run_id)
        cloud = await scrape(fed._cloud_http)
        edge = await scrape(fed.edges[0].http)
    assert final.status == RunStatus.finished
    assert [[(f.client_id, f.kind) for f in h.failed_clients] for h in history] == [[(1, "user_code")]] * 2
    assert value(cloud, "fl_cloud_client_failures_total", reason="user_code") == 2
    assert value(cloud, "fl_cloud_client_failures_total", reason="training") == 0
    assert value(edge, "fl_edge_client_failures_total", reason="user_code") == 2
    assert failures(history) == ["client 1 failed 2 round(s) (user_code), last in round 1: ModuleNotFoundError: "
                                 "No module named 'lab_models'"]


async def test_a_run_whose_every_device_fails_stops_and_says_so(cloud_storage, tmp_path, monkeypatch):
    """Its failed tasks are not handed out again: without the edges' word it stayed `running` for good."""
    failing_for(monkeypatch, None)
    config = RunConfig(name="all-fail", rounds=2, model={"name": "logreg"}, policy={"max_retries": 1},
                       data={"dataset": "digits", "num_clients": 4}, topology={"num_edges": 2})
    async with federation(cloud_storage, tmp_path, num_clients=4, num_edges=2, procs_per_edge=1,
                          cloud={"admission_interval_s": 0.1}) as fed:
        run_id = (await fed.admin.create_run(config)).run_id
        await fed.admin.action(run_id, "start")
        final = await fed.admin.wait(run_id, timeout_s=120)
        r = await fed.cloud_request("GET", f"/api/v1/runs/{run_id}/sites")
    assert (final.status, final.version) == (RunStatus.stopped, 0)
    assert final.reason is not None and final.reason.startswith(
        "every device failed in round 0 (4 device(s)): client 0 (user_code): ModuleNotFoundError: No module named "
        "'lab_models'"), final.reason
    # The run's sites say so too: what stopped it is their tallies of round 0, every task failed.
    seen = RunSites.model_validate_json(r.content)
    assert seen.all_failed and [(s.edge_id, s.version, s.tasks, s.failed) for s in seen.sites] == [
        (0, 0, 2, 2), (1, 0, 2, 2)]
