"""The single-process development cloud: its state in memory (FL_CLOUD_STORAGE=memory), refused beyond
loopback as the development tokens are, since everything it holds dies with the process."""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from pydantic import ValidationError

from fl_services.cloud.config import CloudSettings
from fl_services.cloud.storage import MemoryStore
from fl_services.fedctl.redis_server import free_port
from tests.cloud.harness import contribution, running_cloud, running_run, small_config

ROOT = Path(__file__).resolve().parents[3]
SECRETS = {"admin_token": "a" * 32, "edge_token": "e" * 32}


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.1.2.3", "cloud.example.org"])
def test_memory_storage_is_refused_beyond_loopback(clean_env, host: str) -> None:
    with pytest.raises(ValidationError, match=f"FL_CLOUD_STORAGE=memory .* listens on {host}, beyond loopback"):
        CloudSettings(host=host, storage="memory", **SECRETS)
    with pytest.raises(ValidationError, match="FL_CLOUD_STORAGE=memory"):  # no opt-out: it is never a service
        CloudSettings(host=host, storage="memory", allow_default_tokens=True)
    assert CloudSettings(host=host, **SECRETS).storage == "redis"


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "::1"])
def test_memory_storage_is_fine_on_loopback(clean_env, host: str) -> None:
    assert CloudSettings(host=host, storage="memory").storage == "memory"


def test_a_memory_cloud_on_all_interfaces_does_not_start() -> None:
    """As an operator meets it: one line saying what is wrong and how to fix it, and a failed exit."""
    env = {"PATH": "/usr/bin:/bin", "FL_CLOUD_HOST": "0.0.0.0", "FL_CLOUD_PORT": "1", "FL_CLOUD_STORAGE": "memory",
           "FL_CLOUD_ADMIN_TOKEN": "a" * 32, "FL_CLOUD_EDGE_TOKEN": "e" * 32}
    done = subprocess.run([sys.executable, "-m", "fl_services.cloud.main"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode != 0
    assert done.stderr.startswith("invalid settings: ") and len(done.stderr.splitlines()) == 1, done.stderr
    assert "FL_CLOUD_STORAGE=memory" in done.stderr and "127.0.0.1" in done.stderr


@pytest.mark.anyio
async def test_a_memory_cloud_trains_a_run_to_its_end_without_redis() -> None:
    nowhere = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there: any use of Redis would fail
    async with running_cloud(nowhere, storage="memory") as cloud:
        assert isinstance(cloud.app.state.store, MemoryStore)
        assert (await cloud.http.get("/health")).status_code == 200
        run_id, global_ = await running_run(cloud, small_config(rounds=2))
        for version in (0, 1):
            r = await cloud.submit(0, contribution(global_, run_id, base_version=version))
            assert r.status_code == 202, r.text
            await cloud.wait_version(run_id, version + 1)
        assert (await cloud.info(run_id))["status"] == "finished"
        assert [r["version"] for r in await cloud.wait_evaluated(run_id)] == [1, 2]


@pytest.mark.slow
def test_fl_cloud_serves_from_memory_with_no_redis_anywhere(tmp_path: Path) -> None:
    port = free_port()
    env = {"PATH": "/usr/bin:/bin", "FL_CLOUD_PORT": str(port), "FL_CLOUD_STORAGE": "memory",
           "FL_CLOUD_REDIS_URL": f"redis://127.0.0.1:{free_port()}/0"}
    with open(tmp_path / "cloud.log", "w") as log:
        cloud = subprocess.Popen([sys.executable, "-m", "fl_services.cloud.main"], cwd=ROOT, env=env, stdout=log,
                                 stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert cloud.poll() is None, (tmp_path / "cloud.log").read_text()
            try:
                health = httpx.get(f"http://127.0.0.1:{port}/health", timeout=2)
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, (tmp_path / "cloud.log").read_text()
                time.sleep(0.2)
        assert health.status_code == 200
        runs = httpx.get(f"http://127.0.0.1:{port}/api/v1/runs", headers={"Authorization": "Bearer dev-admin-token"})
        assert runs.status_code == 200 and runs.json() == []
    finally:
        cloud.terminate()
        cloud.wait(30)
    assert "FL_CLOUD_STORAGE=memory" in (tmp_path / "cloud.log").read_text()
