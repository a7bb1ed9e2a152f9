"""A device's install, the way a device meets it: the wheel without extras (`pip install fl-services`) in a fresh
venv outside the repository holds no server, monitoring, data-set, DP or plotting package; its fl-client and
fedctl answer --help; and its fl-client trains a real run's rounds on the device's own data."""
from __future__ import annotations

import json
import subprocess
import textwrap
from pathlib import Path

import numpy as np
import pytest

from fl_services.fedctl.api import CloudAPI
from fl_services.fedctl.launch import LocalTopology
from fl_services.shared.core.config import RunConfig
from fl_services.shared.core.reports import RunStatus
from tests.integration.test_wheel import environment, install, run
from tests.test_packaging import SERVER_SIDE

pytestmark = pytest.mark.slow

# Packages the servers or the extras would bring (starlette with fastapi, scipy and pandas with the data sets).
NOT_ON_A_DEVICE = SERVER_SIDE | {"starlette", "scipy", "pandas"}


def site_packages_bytes(venv: Path, without: tuple[str, ...] = ()) -> int:
    """The size of the venv's site-packages, less the top-level entries named in `without` (and their dist-info)."""
    (site,) = (venv / "lib").glob("python3*/site-packages")
    total = 0
    for entry in site.iterdir():
        if entry.name.split("-")[0].lower() in without:
            continue
        files = [entry] if entry.is_file() else [f for f in entry.rglob("*") if f.is_file() and not f.is_symlink()]
        total += sum(f.stat().st_size for f in files)
    return total


@pytest.fixture(scope="module")
def device(tmp_path_factory, wheel: Path) -> Path:
    venv = install(wheel, tmp_path_factory.mktemp("device") / "venv")
    print(f"device venv: {site_packages_bytes(venv) / 2**20:.0f} MiB, "
          f"{site_packages_bytes(venv, ('torch',)) / 2**20:.0f} MiB without torch")
    return venv


def installed(venv: Path) -> set[str]:
    listed = json.loads(run(venv / "bin" / "python", "-m", "pip", "list", "--format=json", cwd=venv.parent).stdout)
    return {p["name"].lower().replace("_", "-") for p in listed}


def test_a_device_install_holds_no_server_package(device):
    packages = installed(device)
    assert {"fl-services", "torch", "httpx", "pydantic", "safetensors", "typer"} <= packages
    assert not packages & NOT_ON_A_DEVICE, packages & NOT_ON_A_DEVICE


def test_a_device_install_answers_help(device):
    assert "FL_CLIENT_EDGE_URL" in run(device / "bin" / "fl-client", "--help", cwd=device.parent).stdout
    assert "FL_ADMIN_TOKEN" in run(device / "bin" / "fedctl", "--help", cwd=device.parent).stdout


@pytest.mark.parametrize("server", ["fl-cloud", "fl-edge"])
def test_a_device_install_says_what_a_server_needs(device, server):
    done = subprocess.run([device / "bin" / server], cwd=device.parent, env=environment(), capture_output=True,
                          text=True, timeout=60)
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr == f"{server} needs fastapi, which is not installed: pip install 'fl-services[server]'\n"


LOADER = textwrap.dedent('''
    """The run's data set (a user's loader, installed on every host of the run): 6 features, 2 classes."""
    import numpy as np


    def load(num_clients=2):
        rng = np.random.default_rng(0)
        x = rng.normal(size=(60, 6)).astype(np.float32)
        xt = rng.normal(size=(20, 6)).astype(np.float32)
        return {"x_train": x, "y_train": (x[:, 0] > 0).astype(np.int64), "x_test": xt,
                "y_test": (xt[:, 0] > 0).astype(np.int64), "client_train": np.arange(60) % num_clients}
''')


def test_a_device_install_trains_a_run_on_its_own_data(device, tmp_path):
    (tmp_path / "device_task.py").write_text(LOADER)
    rng = np.random.default_rng(1)
    x = rng.normal(size=(40, 6)).astype(np.float32)
    np.savez(tmp_path / "site.npz", x=x, y=(x[:, 0] > 0).astype(np.int64))
    config = RunConfig(name="device", rounds=2, model={"name": "logreg"},
                       data={"dataset": "device_task:load", "options": {"num_clients": 2}, "partition": "file",
                             "num_clients": 2}, policy={"deadline_s": 120, "min_fraction": 1.0, "max_retries": 0})
    # Client process 0 (client 0) is the device install's fl-client, on its own file; 1 is simulated.
    with LocalTopology(num_clients=2, num_edges=1, procs_per_edge=2, workdir=tmp_path / "services",
                       extra_env={"PYTHONPATH": str(tmp_path)},
                       client_programs={0: [str(device / "bin" / "fl-client")]},
                       client_env={0: {"FL_CLIENT_DATA": f"npz:{tmp_path / 'site.npz'}"}}) as topo,\
            CloudAPI(topo.cloud_url, topo.admin_token) as api:
        assert Path(f"/proc/{topo.clients[0].proc.pid}/cmdline").read_bytes().split(b"\0")[1] == \
            str(device / "bin" / "fl-client").encode()  # the device install's console script
        info = api.create_run(config)
        api.action(info.run_id, "start")
        assert api.wait(info.run_id, timeout_s=300).status == RunStatus.finished
        history = api.history(info.run_id)
    # The device: its 40 rows less the fifth held out; client 1: its 30 of the run's 60, less a fifth.
    assert [{c.client_id: c.num_samples for c in h.clients} for h in history] == [{0: 32, 1: 24}] * 2
    assert all(not h.failed_clients for h in history)
