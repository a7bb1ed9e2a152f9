"""Buffered asynchronous averaging (FedBuff) over real processes: FedAvg, 3 edges × 3 clients, a Redis buffer of
B = 2, a slow site and a slow device (emulated), and the cloud killed (SIGKILL) while a contribution waits in the
buffer. Every accepted contribution is consumed once, and the run equals the reference runner replaying the
buffers it consumed. (Without processes: tests/federation/test_buffered.py.)"""
import signal
import time

import pytest
import torch

from fl_services.shared.core.reference import run_reference, schedule_of
from fl_services.shared.core.reports import RunStatus
from tests.federation.test_buffered import CONFIG, SLOW_SITE
from tests.integration.test_hfpl_services import accepted_keys, buffered_triples
from tests.integration.topology import federation

pytestmark = pytest.mark.slow


def test_buffered_averaging_survives_a_cloud_kill_and_equals_the_reference(tmp_path_factory):
    config = CONFIG.model_copy(update={"name": "fedbuff-crash", "rounds": 14})
    with federation(tmp_path_factory, num_clients=9, num_edges=3, procs_per_edge=1,
                    extra_env={"FL_CLIENT_DVFS_BACKEND": "emulate"}) as (topology, api):
        run_id = api.create_run(config).run_id
        api.action(run_id, "start")
        deadline = time.monotonic() + 180
        while not (api.run(run_id).version >= 4 and (before_kill := buffered_triples(topology, run_id))):
            assert time.monotonic() < deadline, "no moment with a buffered contribution"
            time.sleep(0.05)
        topology.restart_cloud(signal.SIGKILL)

        final = api.wait(run_id, timeout_s=300)
        assert final.status == RunStatus.finished and final.version == config.rounds
        history = api.history(run_id)
        left = buffered_triples(topology, run_id)
        keys = accepted_keys(topology, run_id)
        model = api.model(run_id)
    assert [h.version for h in history] == list(range(1, config.rounds + 1))
    consumed = [(c.edge_id, c.base_version) for h in history for c in h.contributions]
    assert len(consumed) == len(set(consumed)) == 2 * config.rounds  # none twice, none lost
    assert not set(consumed) & set(left)
    assert keys == {f"{run_id}:{e}:{v}" for e, v in consumed + left}
    assert set(before_kill) <= set(consumed)
    stale = [c for h in history for c in h.contributions if c.staleness > 0]
    assert any(c.edge_id == SLOW_SITE for c in stale)
    assert all(c.staleness_weight < 1 or c.dropped for c in stale)

    expected = run_reference(config, schedule=schedule_of(history))
    assert [[(c.edge_id, c.staleness_weight, c.dropped) for c in h.contributions] for h in history] == \
        [[(c.edge_id, c.staleness_weight, c.dropped) for c in h.contributions] for h in expected.history]
    for name, value in expected.global_state.items():
        assert torch.allclose(model[name].to(value.dtype), value, atol=1e-6), name
