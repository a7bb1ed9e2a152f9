"""Secure aggregation over real processes (Redis, the cloud, an edge, two client processes): the model equals plain
FedAvg within the fixed-point bound, and the edge's log names the protocol's steps and no update. What needs no
process (dropouts, malformed shares, what the edge receives): tests/federation/test_secagg.py."""
import pytest

from fl_services.shared.core.config import RunConfig
from fl_services.shared.core.reference import run_reference
from tests.federation.checks import assert_within_fixed_point
from tests.integration.topology import federation, run

pytestmark = pytest.mark.slow


def test_secure_aggregation_over_processes_equals_fedavg_within_the_fixed_point_bound(tmp_path_factory):
    config = RunConfig(name="secagg", rounds=1, model={"name": "logreg"}, data={"num_clients": 5},
                       secure_aggregation={"edge": True, "scale_bits": 8})
    with federation(tmp_path_factory, num_clients=5, procs_per_edge=2,
                    edge_env={0: {"FL_EDGE_LOG_LEVEL": "info"}}) as (topo, api):
        _, history, model = run(api, config)
        log = "".join(path.read_text() for path in topo.workdir.glob("*edge*.log"))
    assert [c.client_id for c in history[0].clients] == [0, 1, 2, 3, 4]
    assert 0 < assert_within_fixed_point(model, run_reference(config).global_state, config) <= 2.0 ** -9
    assert "masked inputs from 5 of 5 devices" in log
