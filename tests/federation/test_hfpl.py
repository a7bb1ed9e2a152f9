"""Prototype learning through the services: three model families, three edges with a buffer of B = 2 and one
edge 3× slower, and the one-edge B = 1 case, which runs synchronously. (The cloud and an edge killed
mid-run: tests/integration/test_hfpl_services.py, with real processes.)"""
import pytest

from fl_services.shared.core.config import RunConfig
from tests.federation.checks import assert_same_model, reference, run
from tests.federation.harness import federation
from tests.integration.test_hfpl_services import CONFIG

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
