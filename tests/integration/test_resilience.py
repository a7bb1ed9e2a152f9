"""Failures over real processes: a killed cloud (SIGKILL) and services told to stop (SIGTERM). Pause/resume,
clients that drop out and a run stopped mid-round: tests/federation/test_control.py."""
import os
import signal
import time

import pytest
import torch

from fl_services.fedctl.launch import LocalTopology
from fl_services.shared.core.config import RunConfig
from fl_services.shared.core.reference import run_reference
from fl_services.shared.core.reports import RunStatus
from tests.integration.topology import federation

pytestmark = pytest.mark.slow

# Small and quick, but with E=2, minibatches and partial participation.
CONFIG = dict(model={"name": "mlp"}, data={"dataset": "digits", "num_clients": 6},
              local={"epochs": 2, "batch_size": 16, "lr": 0.1}, fraction=0.5)


@pytest.fixture(scope="module", params=["blobs in redis", "blobs in files"])
def running(request, tmp_path_factory):
    # In files: contributions' blobs on the volume (FL_CLOUD_BLOB_DIR), their names in Redis.
    env = {} if request.param == "blobs in redis" else {
        "FL_CLOUD_BLOB_DIR": str(tmp_path_factory.mktemp("blobs"))}
    with federation(tmp_path_factory, num_clients=6, extra_env=env) as topology_and_api:
        yield topology_and_api


@pytest.fixture(scope="module")
def topology(running):
    return running[0]


@pytest.fixture(scope="module")
def api(running):
    return running[1]


def wait_version(api, run_id, at_least, timeout=120):
    deadline = time.monotonic() + timeout
    while (info := api.run(run_id)).version < at_least:
        assert time.monotonic() < deadline, f"stuck at version {info.version}"
        time.sleep(0.05)
    return info


def test_a_killed_cloud_loses_nothing_and_counts_nothing_twice(api, topology):
    config = RunConfig(name="crash", rounds=8, **CONFIG)
    run_id = api.create_run(config).run_id
    api.action(run_id, "start")
    wait_version(api, run_id, 3)
    topology.restart_cloud(signal.SIGKILL)  # mid-run: edges and clients keep retrying
    final = api.wait(run_id, timeout_s=180)
    assert final.status == RunStatus.finished and final.version == config.rounds
    history = api.history(run_id)
    assert [h.version for h in history] == list(range(1, config.rounds + 1))
    reference = run_reference(config)
    model = api.model(run_id)
    for name, value in reference.global_state.items():
        assert torch.allclose(model[name], value, atol=1e-5), name


def test_services_stop_at_once_while_long_polls_wait(tmp_path):
    """SIGTERM ends a service's open long-polls (204) instead of waiting them out: with 10-minute polls
    in flight (edges at the cloud, clients at the edge) each process exits well inside docker's
    10 s grace. Before, uvicorn held the shutdown until every poll's timeout. Its services start cold, as
    `python -m` processes, so that start-up stays tested too (the other topologies start warm)."""
    polls = {"FL_CLOUD_LONG_POLL_MAX_S": "600", "FL_EDGE_LONG_POLL_MAX_S": "600", "FL_CLIENT_LONG_POLL_S": "600"}
    topology = LocalTopology(num_clients=2, num_edges=1, procs_per_edge=1, workdir=tmp_path,
                             redis_url=os.environ.get("REDIS_URL"), extra_env=polls, cold=True).start()
    try:
        time.sleep(1.0)  # the edge is polling the cloud, the client process the edge
        for service in (topology.cloud, topology.edges[0]):
            started = time.monotonic()
            service.stop(signal.SIGTERM, timeout=60)  # SIGKILL only after 60 s
            assert time.monotonic() - started < 8, f"{service.name} took {time.monotonic() - started:.1f}s to stop"
    finally:
        topology.stop()
