"""Secure aggregation at both tiers over real processes (Redis, the cloud, two edges, a client process each): each
edge unmasks only its devices' sum, the cloud only the sites' total, and the model equals plain FedAvg within the
fixed-point bound. What needs no process (dropouts, malformed shares, what the edge and the cloud receive):
tests/federation/test_secagg.py."""
import pytest

from fl_services.shared.core.config import RunConfig
from fl_services.shared.core.reference import run_reference
from tests.federation.checks import assert_within_fixed_point
from tests.integration.topology import federation, run

pytestmark = pytest.mark.slow


def test_both_tiers_over_processes_equal_fedavg_within_the_fixed_point_bound(tmp_path_factory):
    config = RunConfig(name="secagg", rounds=1, model={"name": "logreg"}, data={"num_clients": 6},
                       topology={"num_edges": 2}, secure_aggregation={"edge": True, "cloud": True, "scale_bits": 8})
    info_level = {"FL_EDGE_LOG_LEVEL": "info"}
    with federation(tmp_path_factory, num_clients=6, num_edges=2, procs_per_edge=1,
                    edge_env={0: info_level, 1: info_level}) as (topo, api):
        final, history, model = run(api, config)
        logs = [(topo.workdir / f"edge{e}.log").read_text() for e in (0, 1)]
    keys = final.config.secure_aggregation.site_keys
    assert keys is not None and sorted(keys) == [0, 1]
    assert sorted(c.client_id for c in history[0].clients) == list(range(6)) and history[0].edges == [0, 1]
    assert 0 < assert_within_fixed_point(model, run_reference(config).global_state, config) <= 2.0 ** -9
    assert all("masked inputs from 3 of 3 devices" in log for log in logs)
