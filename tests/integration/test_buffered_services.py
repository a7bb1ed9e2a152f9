"""Buffered asynchronous averaging (FedBuff) at both tiers over real processes: FedAvg, 3 edges × 3 emulated
devices, a Redis buffer of B = 2, each edge round closed at its second answer, a slow site and a slow device per
edge, and the cloud killed (SIGKILL) while a contribution waits in the buffer. Every accepted contribution is
consumed once, and the run equals the reference runner replaying the buffers it consumed.
(Without processes: tests/federation/test_buffered.py.)"""
import pytest
import torch

from fl_services.shared.core.reference import run_reference, schedule_of
from tests.federation.test_buffered import BOTH_TIERS, SLOW_SITE
from tests.integration.test_hfpl_services import run_with_a_cloud_kill
from tests.integration.topology import federation, run

pytestmark = pytest.mark.slow


def test_buffered_averaging_survives_a_cloud_kill_and_equals_the_reference(tmp_path_factory):
    config = BOTH_TIERS.model_copy(update={"name": "fedbuff-crash", "rounds": 14})
    with federation(tmp_path_factory, num_clients=9, num_edges=3, procs_per_edge=1,
                    extra_env={"FL_CLIENT_DVFS_BACKEND": "emulate"}) as (topology, api):
        run(api, config.model_copy(update={"name": "warm-up", "rounds": 1}))  # see run_and_replay
        run_id, history = run_with_a_cloud_kill(topology, api, config)
        model = api.model(run_id)
    assert {c.client_id for h in history for c in h.clients} == {1, 2, 3, 5, 6, 7}  # the slow three never count
    stale = [c for h in history for c in h.contributions if c.staleness > 0]
    assert any(c.edge_id == SLOW_SITE for c in stale)
    assert all(c.staleness_weight < 1 or c.dropped for c in stale)

    expected = run_reference(config, schedule=schedule_of(history))
    assert [[(c.edge_id, c.staleness_weight, c.dropped) for c in h.contributions] for h in history] == \
        [[(c.edge_id, c.staleness_weight, c.dropped) for c in h.contributions] for h in expected.history]
    assert [[c.client_id for c in h.clients] for h in history] == \
        [[c.client_id for c in h.clients] for h in expected.history]
    for name, value in expected.global_state.items():
        assert torch.allclose(model[name].to(value.dtype), value, atol=1e-6), name
