"""Many logical clients per process through real processes: cloud + 1 edge + 2 client processes hosting 100
logical clients each, every client process holding one long-poll for all of its clients (client/feed.py).
A run with every client each round and one with a tenth of them both equal the in-process reference."""
import signal
import time

import pytest

from fl_services.shared.core.config import RunConfig
from fl_services.shared.core.reference import run_reference
from fl_services.shared.core.reports import RunStatus
from tests.federation.checks import assert_same_model
from tests.integration.topology import federation, run

pytestmark = pytest.mark.slow
CLIENTS = 200


@pytest.fixture(scope="module")
def topology(tmp_path_factory):
    # INFO: the edge's access log shows which routes the client processes used.
    env = {"FL_EDGE_LOG_LEVEL": "info"}
    with federation(tmp_path_factory, num_clients=CLIENTS, extra_env=env) as (topo, api):
        yield topo, api


@pytest.mark.parametrize("fraction", [1.0, 0.1])
def test_two_hundred_clients_in_two_processes_equal_the_reference(topology, fraction):
    topo, api = topology
    config = RunConfig(name=f"many-{fraction}", rounds=3, fraction=fraction, model={"name": "logreg"},
                       data={"dataset": "digits", "num_clients": CLIENTS}, local={"epochs": 1, "batch_size": 8},
                       policy={"min_fraction": 1.0})
    _, history, model = run(api, config)
    reference = run_reference(config)
    assert [sorted(c.client_id for c in h.clients) for h in history] ==\
        [sorted(c.client_id for c in h.clients) for h in reference.history]
    assert all(len(h.clients) == round(CLIENTS * fraction) for h in history)
    assert_same_model(model, reference.global_state)
    log = (topo.workdir / "edge0.log").read_text()
    # One batch long-poll per process, never one per logical client.
    assert "POST /api/v1/clients/tasks" in log and "/task?" not in log


def test_an_edge_killed_mid_run_gets_every_client_back_and_the_run_equals_the_reference(topology):
    """The restarted edge knows none of the 200 clients: each process hears so in its poll's answer
    (X-FL-Unknown-Clients), registers them again, and the round it re-runs completes with all of them."""
    topo, api = topology
    config = RunConfig(name="many-restart", rounds=4, model={"name": "logreg"},
                       data={"dataset": "digits", "num_clients": CLIENTS}, local={"epochs": 1, "batch_size": 8},
                       policy={"min_fraction": 1.0})
    run_id = api.create_run(config).run_id
    api.action(run_id, "start")
    deadline = time.monotonic() + 120
    while api.run(run_id).version < 1:
        assert time.monotonic() < deadline, "the run never reached version 1"
        time.sleep(0.05)
    topo.restart_edge(0, signal.SIGKILL)
    final = api.wait(run_id, timeout_s=300)
    assert final.status == RunStatus.finished and final.version == config.rounds
    history = api.history(run_id)
    assert all(len(h.clients) == CLIENTS for h in history)
    assert_same_model(api.model(run_id), run_reference(config).global_state)
