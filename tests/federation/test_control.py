"""Control and failures through the services: pause/resume, clients that drop out, a run stopped mid-round.
(A killed cloud and services stopped by SIGTERM: tests/integration/test_resilience.py, with real processes.)"""
import asyncio
import time

import pytest

from fl_services.shared.core.config import RunConfig
from fl_services.shared.core.reports import RunStatus
from tests.federation.harness import federation

pytestmark = pytest.mark.anyio

# Small and quick, but with E=2, minibatches and partial participation.
CONFIG = dict(model={"name": "mlp"}, data={"dataset": "digits", "num_clients": 6},
              local={"epochs": 2, "batch_size": 16, "lr": 0.1}, fraction=0.5)


async def test_pause_holds_the_version_and_resume_finishes(cloud_storage, tmp_path):
    config = RunConfig(name="pause", rounds=6, **CONFIG)
    async with federation(cloud_storage, tmp_path, num_clients=6) as fed:
        admin = fed.admin
        run_id = (await admin.create_run(config)).run_id
        await admin.action(run_id, "start")
        await admin.wait_version(run_id, 1)
        paused = await admin.action(run_id, "pause")
        assert paused.status == RunStatus.paused
        await asyncio.sleep(0.5)  # an update already buffered when we paused may still land
        held = (await admin.run(run_id)).version
        await asyncio.sleep(2.0)
        assert (await admin.run(run_id)).version == held and held < config.rounds
        await admin.action(run_id, "resume")
        final = await admin.wait(run_id, timeout_s=120)
    assert final.status == RunStatus.finished and final.version == config.rounds


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
        await asyncio.sleep(1.0)  # its two clients answer; the other two never will
        stopped = time.monotonic()
        await admin.action(run_id, "stop")
        await until(lambda: edge.health(), lambda h: h.run_id is None, 30, "the edge drops the stopped run")
        released_s = time.monotonic() - stopped
        print(f"edge released {released_s:.2f} s after the stop")
        assert released_s < 3
        following = await admin.create_run(RunConfig(name="next", data={"dataset": "digits", "num_clients": 2},
                                                     **small))
        await admin.action(following.run_id, "start")
        final = await admin.wait(following.run_id, timeout_s=120)
    assert final.status == RunStatus.finished and final.version == 2


async def until(read, condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition(await read()):
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}"
        await asyncio.sleep(0.05)
