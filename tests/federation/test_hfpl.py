"""Prototype learning through the services: three model families, three edges with a buffer of B = 2 and one
edge 3× slower, and the one-edge B = 1 case, which runs synchronously. (The cloud and an edge killed
mid-run: tests/integration/test_hfpl_services.py, with real processes.)"""
import pytest
import torch

from fl_services.shared.core.config import RunConfig
from fl_services.shared.core.reference import schedule_of
from tests.federation.checks import assert_same_model, reference, run
from tests.federation.harness import federation
from tests.integration.test_hfpl_services import CONFIG, SLOW_EDGE

pytestmark = pytest.mark.anyio


async def test_single_edge_buffer_of_one_runs_synchronously_and_equals_the_reference(cloud_storage, tmp_path):
    config = RunConfig(name="hfpl-flat", rounds=4, topology={"num_edges": 1, "buffer_size": 1},
                       **{**CONFIG, "data": {**CONFIG["data"], "num_clients": 4}})
    async with federation(cloud_storage, tmp_path, num_clients=4, num_edges=1, procs_per_edge=2) as fed:
        _, history, model = await run(fed.admin, config, timeout_s=180)
    assert all(c.staleness == 0 for h in history for c in h.contributions)
    expected = await reference(config)
    assert_same_model(model, expected.global_state, atol=1e-4)
    assert [h.test_accuracy for h in history] == pytest.approx([h.test_accuracy for h in expected.history], abs=1e-6)
    assert history[-1].server_metrics  # the mean nearest-prototype accuracy, once C̄ exists
    for got, want in zip(history, expected.history, strict=True):
        assert got.server_metrics == pytest.approx(want.server_metrics, abs=1e-6)


LEVERS = {"momentum": 0.5, "proto_distance": "mean", "proto_weight": 1.0, "inference": "nearest_prototype",
          "own_classes": True, "staleness": "fedbuff"}


# Either G other than the default: the cosine one, or the mlp one, whose hidden layer travels in the task.
@pytest.mark.parametrize("classifier", [{"classifier": "cosine", "classifier_scale": 8.0},
                                        {"classifier": "mlp", "classifier_width": 16}], ids=["cosine", "mlp"])
async def test_the_levers_travel_through_the_services_and_equal_the_reference(cloud_storage, tmp_path, classifier):
    """Every lever of docs/fedproto-protocol.md set at once, asynchronously: the services' model and every
    client's reported figures equal the in-process reference replaying the same buffers, and differ from
    the run without the levers."""
    # 14 updates: enough for the slow edge's triples to be consumed stale.
    config = RunConfig(name="hfpl-levers", rounds=14, topology={"num_edges": 3, "buffer_size": 2},
                       **{**CONFIG, "params": {**CONFIG["params"], **LEVERS, **classifier}})
    slow = {SLOW_EDGE: {"slowdown": 3.0}}
    async with federation(cloud_storage, tmp_path, num_clients=12, num_edges=3, procs_per_edge=1,
                          edge=lambda e: slow.get(e, {})) as fed:
        _, history, model = await run(fed.admin, config)
    # The slow edge's triples usually arrive stale (test_hfpl_services.py's crash test asserts it); on a loaded
    # machine the arrival order can differ, so the staleness rule is checked by hand in test_hfpl.py, and here
    # only through the equality whatever the schedule.
    schedule = schedule_of(history)
    expected = await reference(config, schedule=schedule)
    assert model.keys() == expected.global_state.keys()  # the mlp G's hidden layer too
    assert_same_model(model, expected.global_state, atol=1e-4)
    for got, want in zip(history, expected.history, strict=True):
        assert [c.client_id for c in got.clients] == [c.client_id for c in want.clients]
        for mine, theirs in zip(got.clients, want.clients, strict=True):
            assert mine.metrics == pytest.approx(theirs.metrics, abs=1e-6)
            # Nearest-prototype inference: once C̄ exists, the reported accuracy is that rule's.
            assert "proto_accuracy" not in mine.metrics or mine.metrics["accuracy"] == mine.metrics["proto_accuracy"]
    plain = await reference(config.model_copy(update={"params": CONFIG["params"]}), schedule=schedule)
    assert not torch.allclose(plain.global_state["prototypes"], expected.global_state["prototypes"])
