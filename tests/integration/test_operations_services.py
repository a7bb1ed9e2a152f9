"""Operations as an operator meets them, over real processes: a device token issued with `fedctl
issue-token` works for its client only, `fedctl revoke-token` makes the edges refuse it (and it alone) within
their refresh, `fedctl audit` shows who did it, and `fedctl delete` removes a stopped run. (A client process
holding a token per logical client, one of them revoked: tests/federation/test_device_tokens.py.)"""
from __future__ import annotations

import os
import subprocess
import sys
import time

import httpx
import pytest

from fl_services.fedctl.api import CloudAPI
from fl_services.fedctl.launch import ROOT, LocalTopology
from fl_services.shared.core.config import RunConfig

pytestmark = pytest.mark.slow


def fedctl(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "-m", "fl_services.fedctl", *args], cwd=ROOT, env={**os.environ, **env},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def register(edge: str, client_id: int, token: str) -> httpx.Response:
    return httpx.post(f"{edge}/api/v1/clients", json={"client_id": client_id},
                      headers={"Authorization": f"Bearer {token}"}, timeout=10)


def test_a_device_token_is_revoked_alone_and_the_audit_log_says_who(tmp_path):
    with LocalTopology(num_clients=0, num_edges=1, workdir=tmp_path,
                       redis_url=os.environ.get("REDIS_URL"),
                       extra_env={"FL_EDGE_REVOCATION_REFRESH_S": "0.5"}) as topology:
        env = {"FL_CLOUD_URL": topology.cloud_url, "FL_ADMIN_TOKEN": topology.admin_token,
               "FL_EDGE_CLIENT_TOKEN": topology.client_token}
        edge = topology.edges[0].address()
        issued = fedctl("issue-token", "1", env=env)
        token, token_id = issued.stdout.strip(), issued.stderr.split()[2]
        other = fedctl("issue-token", "1", env=env).stdout.strip()  # a second device playing client 1
        assert register(edge, 1, token).status_code == 200
        assert register(edge, 0, token).status_code == 401  # client 1's token only

        fedctl("revoke-token", token_id, env=env)
        revoked = time.monotonic()
        while register(edge, 1, token).status_code != 401:
            assert time.monotonic() - revoked < 10, "the edge still accepts the revoked token"
            time.sleep(0.1)
        print(f"refused {time.monotonic() - revoked:.2f} s after fedctl revoke-token returned")
        assert "revoked" in register(edge, 1, token).json()["detail"]
        assert register(edge, 1, other).status_code == 200  # the other device is untouched

        with CloudAPI(topology.cloud_url, topology.admin_token) as api:
            run_id = api.create_run(RunConfig(model={"name": "logreg"}, data={"dataset": "digits", "num_clients": 2},
                                              rounds=1)).run_id
            # A header any local caller can send does not choose the address the audit log records.
            stopped = httpx.post(f"{topology.cloud_url}/api/v1/runs/{run_id}/stop", timeout=10,
                                 headers={"Authorization": f"Bearer {topology.admin_token}",
                                          "X-Forwarded-For": "203.0.113.9"})
            assert stopped.status_code == 200, stopped.text
            fedctl("delete", run_id, env=env)
            assert [info.run_id for info in api.runs()] == []
        log = fedctl("audit", env=env).stdout.splitlines()
        assert [line.split()[4] for line in log] == ["delete", "stop", "create", "revoke"]
        assert log[-1].split()[2:4] == ["admin", "127.0.0.1"] and token_id in log[-1]
        assert [line.split()[3] for line in log] == ["127.0.0.1"] * 4, log
