"""Buffered asynchronous averaging (FedBuff) at both tiers over real processes: FedAvg, 3 edges × 3 emulated
devices, a Redis buffer of B = 2, each edge round closed at its second answer (the late one dropped, or joined to a
later round: policy.late), a slow site and a slow device per edge, and the cloud killed (SIGKILL) while a
contribution waits in the buffer. Every accepted contribution is consumed once, and the run equals the reference
runner replaying the buffers it consumed.
(Without processes: tests/federation/test_buffered.py.)"""
import pytest
import torch

from fl_services.shared.core.reference import joined_of, run_reference, schedule_of
from tests.federation.test_buffered import BOTH_TIERS, LATE_JOIN, SLOW_SITE
from tests.integration.test_hfpl_services import run_with_a_cloud_kill
from tests.integration.topology import federation, run

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("tiers", [BOTH_TIERS, LATE_JOIN], ids=["late-dropped", "late-joined"])
def test_buffered_averaging_survives_a_cloud_kill_and_equals_the_reference(tmp_path_factory, tiers):
    config = tiers.model_copy(update={"name": "fedbuff-crash", "rounds": 14})
    join = config.policy.late == "join"
    with federation(tmp_path_factory, num_clients=9, num_edges=3, procs_per_edge=1,
                    extra_env={"FL_CLIENT_DVFS_BACKEND": "emulate"}) as (topology, api):
        run(api, config.model_copy(update={"name": "warm-up", "rounds": 1}))  # see run_and_replay
        run_id, history = run_with_a_cloud_kill(topology, api, config, SLOW_SITE)
        model = api.model(run_id)
    counted = {c.client_id for h in history for c in h.clients}
    # The slow three never close a round; dropped, they never count; joined, client 0's answers do (see LATE_JOIN).
    assert (0 in counted) if join else counted == {1, 2, 3, 5, 6, 7}
    assert any(c.joined for h in history for c in h.contributions) == join
    stale = [c for h in history for c in h.contributions if c.staleness > 0]
    assert any(c.edge_id == SLOW_SITE for c in stale)
    assert all(c.staleness_weight < 1 or c.dropped for c in stale)

    expected = run_reference(config, schedule=schedule_of(history), joined=joined_of(history) if join else None)
    assert [[(c.edge_id, c.staleness_weight, c.dropped, c.joined, c.clients) for c in h.contributions]
            for h in history] == [[(c.edge_id, c.staleness_weight, c.dropped, c.joined, c.clients)
                                   for c in h.contributions] for h in expected.history]
    assert [[c.client_id for c in h.clients] for h in history] == \
        [[c.client_id for c in h.clients] for h in expected.history]
    for name, value in expected.global_state.items():
        assert torch.allclose(model[name].to(value.dtype), value, atol=1e-6), name
