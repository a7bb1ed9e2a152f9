"""The cloud publishes a version before evaluating it: edges train on it while the evaluation runs, and its
history record gets the evaluation's figures once they are in (the same as evaluating it first)."""
from __future__ import annotations

import math
import threading

import pytest

import fl_services.cloud.orchestrator as orchestrator_module
from fl_services.cloud.ui.view import LiveRun
from fl_services.shared.core.algorithms import registry
from fl_services.shared.core.federation import evaluate_global
from fl_services.shared.core.records import decode
from fl_services.shared.wire.edge_cloud import GlobalStateHeader
from tests.cloud.harness import Cloud, contribution, running_run, small_config

pytestmark = pytest.mark.anyio


async def submit(cloud: Cloud, run_id: str, version: int) -> None:
    global_, _ = await cloud.global_state()
    r = await cloud.submit(0, contribution(global_, run_id, base_version=version))
    assert r.status_code == 202, r.text


@pytest.fixture
def held_evaluation(monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """The first evaluation the loop starts off the critical path waits for the event the test sets."""
    release = threading.Event()

    def held(*args, **kwargs):
        assert release.wait(30), "the test never released the evaluation"
        return evaluate_outcome(*args, **kwargs)

    evaluate_outcome = orchestrator_module.evaluate_outcome
    monkeypatch.setattr(orchestrator_module, "evaluate_outcome", held)
    return release


async def test_a_version_is_served_before_its_evaluation_and_its_record_filled_in_after(
        cloud: Cloud, held_evaluation: threading.Event) -> None:
    run_id, _ = await running_run(cloud, small_config(rounds=3))
    await submit(cloud, run_id, 0)
    await cloud.wait_version(run_id, 1)
    # Version 1 is served while its evaluation is held; its record is there, not evaluated yet.
    _, header = await cloud.global_state()
    assert header.version == 1
    [record] = await cloud.history(run_id)
    assert record["version"] == 1 and record["test_accuracy"] is None and record["test_loss"] is None
    held_evaluation.set()
    [record] = await cloud.wait_evaluated(run_id)
    # The figures of evaluating version 1 before publishing it, as the reference runner does.
    r = await cloud.edge("GET", "/api/v1/edges/0/global", params={"timeout": 0})
    served, header = decode(r.content, GlobalStateHeader)
    inline = evaluate_global(header.config, registry.create(header.config), served, {})
    assert (record["test_loss"], record["test_accuracy"]) == (inline.loss, inline.accuracy)


async def test_a_finished_run_has_every_record_evaluated(cloud: Cloud) -> None:
    """The next update waits for the evaluation before it; the last is evaluated before it is published."""
    run_id, _ = await running_run(cloud, small_config(rounds=3))
    for version in range(3):
        await submit(cloud, run_id, version)
        info = await cloud.wait_version(run_id, version + 1)
    assert info["status"] == "finished"
    records = await cloud.history(run_id)
    assert [r["version"] for r in records] == [1, 2, 3]
    assert all(0.0 <= r["test_accuracy"] <= 1.0 for r in records), records


async def test_an_evaluation_lost_with_its_process_is_done_before_the_next_update(
        cloud: Cloud, monkeypatch: pytest.MonkeyPatch) -> None:
    """A cloud killed after publishing a version but before evaluating it: the replica (or restarted cloud)
    that computes the next update evaluates the current version first, from the state in Redis."""
    async def lost(self, run_id, algorithm, outcome, record) -> None:
        return None  # the process died before the evaluation was filled in

    monkeypatch.setattr(orchestrator_module.Orchestrator, "_evaluate_later", lost)
    run_id, _ = await running_run(cloud, small_config(rounds=3))
    await submit(cloud, run_id, 0)
    await cloud.wait_version(run_id, 1)
    [record] = await cloud.history(run_id)
    assert record["test_accuracy"] is None
    await submit(cloud, run_id, 1)
    await cloud.wait_version(run_id, 2)
    first, second = await cloud.history(run_id)
    assert 0.0 <= first["test_accuracy"] <= 1.0  # filled in before update 2 was computed
    assert second["test_accuracy"] is None  # lost as well, until update 3


async def test_the_dashboard_stream_sends_a_record_again_once_it_is_evaluated(
        cloud: Cloud, held_evaluation: threading.Event) -> None:
    run_id, _ = await running_run(cloud, small_config(rounds=3))
    live = LiveRun(cloud.app.state.store, run_id)
    assert (await live.update()).rounds == []
    await submit(cloud, run_id, 0)
    await cloud.wait_version(run_id, 1)
    [published] = (await live.update()).rounds
    assert math.isnan(published.test_accuracy)
    assert await live.update() is None  # nothing changed meanwhile
    held_evaluation.set()
    await cloud.wait_evaluated(run_id)
    [evaluated] = (await live.update()).rounds
    assert evaluated.version == 1 and 0.0 <= evaluated.test_accuracy <= 1.0
    assert live.history == [evaluated] and await live.update() is None
