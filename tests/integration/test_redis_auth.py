"""The cloud and a Redis that requires a password (or a client certificate), as an operator meets them: the
cloud as a process, started with a right or a wrong credential, also in the middle of a run."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from urllib.parse import quote

import pytest

from fl_services.fedctl.api import CloudAPI
from fl_services.fedctl.certs import write_deployment
from fl_services.fedctl.launch import ROOT, LocalTopology, Service
from fl_services.fedctl.redis_server import RedisServer, free_port
from fl_services.shared.core.config import RunConfig
from fl_services.shared.core.reference import run_reference
from fl_services.shared.core.reports import RunStatus
from tests.federation.checks import assert_same_model
from tests.integration.test_resilience import wait_version

pytestmark = pytest.mark.slow


def run_cloud(env: dict[str, str], timeout: float = 180.0) -> subprocess.CompletedProcess[str]:
    """The cloud as `python -m fl_services.cloud.main`, which must exit on its own within `timeout` (it refuses a
    Redis before importing torch, in about a second; a machine shared with other work takes many times that)."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("FL_CLOUD_")}
    return subprocess.run([sys.executable, "-m", "fl_services.cloud.main"], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env={**clean, "FL_CLOUD_PORT": str(free_port()), **env})


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory):
    with RedisServer(dir=tmp_path_factory.mktemp("redis"), appendonly=False) as server:
        yield server


@pytest.mark.parametrize("credential", ["wrong-password", "", "nobody:wrong-password"])
def test_a_wrong_redis_credential_stops_the_cloud_at_start_up_with_one_clear_line(redis_server, credential):
    user, _, password = credential.rpartition(":")
    auth = f"{quote(user)}:{quote(password)}@" if credential else ""
    result = run_cloud({"FL_CLOUD_REDIS_URL": f"redis://{auth}127.0.0.1:{redis_server.port}/0"})
    assert result.returncode == 1, result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    assert f"Redis at 127.0.0.1:{redis_server.port} refused the cloud's credentials" in result.stderr
    assert "FL_CLOUD_REDIS_URL" in result.stderr
    assert redis_server.password not in result.stderr and "wrong-password" not in result.stderr


def test_redis_over_tls_with_an_unknown_ca_stops_the_cloud_at_start_up(tmp_path):
    write_deployment(tmp_path / "ours", edges=0, clients=0)
    write_deployment(tmp_path / "other", edges=0, clients=0)
    with RedisServer(dir=tmp_path / "redis", appendonly=False, tls_dir=tmp_path / "ours") as server:
        result = run_cloud({"FL_CLOUD_REDIS_URL": server.url,
                            "FL_CLOUD_REDIS_CA_FILE": str(tmp_path / "other" / "ca.pem"),
                            "FL_CLOUD_REDIS_CERT_FILE": str(tmp_path / "ours" / "cloud.pem"),
                            "FL_CLOUD_REDIS_KEY_FILE": str(tmp_path / "ours" / "cloud.key")})
    assert result.returncode == 1, result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    assert f"TLS with Redis at 127.0.0.1:{server.port} failed" in result.stderr
    assert "CERTIFICATE_VERIFY_FAILED" in result.stderr


def test_the_cloud_serves_with_the_right_password_and_over_tls(tmp_path):
    write_deployment(tmp_path / "certs", edges=0, clients=0)
    with RedisServer(dir=tmp_path / "redis", appendonly=False, tls_dir=tmp_path / "certs") as server:
        port = free_port()
        cloud = Service("cloud", ["-m", "fl_services.cloud.main"], {
            "FL_CLOUD_PORT": str(port), "FL_CLOUD_REDIS_URL": server.url,
            "FL_CLOUD_REDIS_CA_FILE": str(tmp_path / "certs" / "ca.pem"),
            "FL_CLOUD_REDIS_CERT_FILE": str(tmp_path / "certs" / "cloud.pem"),
            "FL_CLOUD_REDIS_KEY_FILE": str(tmp_path / "certs" / "cloud.key")}, tmp_path / "cloud.log",
            url=f"http://127.0.0.1:{port}")
        cloud.start()
        try:
            cloud.wait_healthy()
            assert cloud.health().json()["status"] == "ok"  # its health pings Redis
        finally:
            cloud.stop()


def test_a_cloud_restarted_with_a_wrong_password_touches_nothing_and_the_right_one_loses_nothing(tmp_path):
    """The cloud killed mid-run and started again with a wrong Redis password exits with one clear line and
    changes nothing; started with the right one, the run finishes on the reference model with every version
    once: nothing the killed cloud had accepted is lost."""
    config = RunConfig(name="wrong-password", rounds=10, model={"name": "logreg"}, local={"lr": 0.1},
                       data={"dataset": "digits", "num_clients": 4})
    # Its own Redis (not $REDIS_URL): the one it starts requires a password.
    with LocalTopology(num_clients=4, num_edges=1, procs_per_edge=1, workdir=tmp_path) as topology,\
            CloudAPI(topology.cloud_url, topology.admin_token) as api:
        run_id = api.create_run(config).run_id
        api.action(run_id, "start")
        info = wait_version(api, run_id, 2)
        cloud = topology.cloud
        assert cloud is not None and topology.redis is not None and topology.redis_url is not None
        cloud.stop(signal.SIGKILL)
        assert info.status == RunStatus.running and info.version < config.rounds
        wrong = topology.redis_url.replace(quote(topology.redis.password, safe=""), "wrong-password")
        result = run_cloud({**cloud.env, "FL_CLOUD_REDIS_URL": wrong})
        assert result.returncode == 1 and "refused the cloud's credentials" in result.stderr, result.stderr[-3000:]
        topology.restart_cloud(signal.SIGKILL)
        final = api.wait(run_id, timeout_s=300)
        history, model = api.history(run_id), api.model(run_id)
    assert final.status == RunStatus.finished
    assert [h.version for h in history] == list(range(1, config.rounds + 1))
    assert_same_model(model, run_reference(config).global_state)
