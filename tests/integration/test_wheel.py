"""The installed package, the way its users meet it (docs/tutorial-federation-of-devices.md): the wheel built from
this checkout, installed into a fresh virtual environment outside the repository, started outside the repository
with no PYTHONPATH.

First a device's install, the wheel without extras (`pip install fl-services`): it holds no server, monitoring,
data-set, DP or plotting package; its fl-client and fedctl answer --help, its fl-cloud and fl-edge say which extra
they need; and its fl-client trains a real run's rounds on the device's own data. Then every extra is added to the
same venv (the services' install): the console scripts are there, and the installed fl-client serves two of the
four clients of a real run that finishes on the in-process reference's model. One venv for both, in that order:
the device's checks run before the extras are added (this file's order; each checks it)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
import tomllib
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from fl_services.fedctl.api import CloudAPI
from fl_services.fedctl.launch import LocalTopology
from fl_services.shared.core.config import RunConfig
from fl_services.shared.core.reference import run_reference
from fl_services.shared.core.reports import RunStatus
from tests.test_packaging import SERVER_SIDE

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
PACKAGES = PYPROJECT["tool"]["setuptools"]["packages"]
SCRIPTS = PYPROJECT["project"]["scripts"]
TOP_LEVEL = sorted({p.split(".")[0] for p in PACKAGES})
TORCH_PIN = next(r for r in PYPROJECT["project"]["dependencies"] if r.startswith("torch=="))


def packaged_sources() -> list[str]:
    """Every file under the top-level packages in the checkout, as a path inside the wheel: a subpackage
    or data file missing from pyproject.toml's lists fails here rather than on a device."""
    found = []
    for top in TOP_LEVEL:  # fl_services/: its subpackages are links to the top-level directories
        for folder, dirs, files in os.walk(ROOT / top, followlinks=True):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            found += [str((Path(folder) / f).relative_to(ROOT)) for f in files]
    return sorted(found)


def run(*args: str | Path, cwd: Path, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([str(a) for a in args], cwd=cwd, env=environment(), capture_output=True, text=True,
                          timeout=timeout, check=True)


def environment() -> dict[str, str]:
    # What a device has: nothing pointing at this checkout.
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}


def build_wheel(tmp: Path) -> Path:
    """The wheel of this checkout, built in `tmp` and checked to hold every file of the packages and the console
    scripts."""
    assert not tmp.resolve().is_relative_to(ROOT)
    # Built from a copy of what the wheel is made of: setuptools writes build/ and *.egg-info into the source
    # tree, and a stale build/lib left in the checkout would leak deleted modules into later wheels.
    src = tmp / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    for top in TOP_LEVEL:
        shutil.copytree(ROOT / top, src / top, ignore=shutil.ignore_patterns("__pycache__"))
    started = time.monotonic()
    # With this environment's setuptools (pyproject.toml's build requirement, in the dev dependencies): an
    # isolated build env would install setuptools afresh for every build.
    run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--wheel-dir", tmp / "dist", src,
        cwd=tmp)
    build_s = time.monotonic() - started
    (wheel,) = (tmp / "dist").glob("fl_services-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert sorted(n for n in names if ".dist-info/" not in n) == packaged_sources()
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    assert all(f"{script} = {target}" in zipfile.ZipFile(wheel).read(entry_points).decode()
               for script, target in SCRIPTS.items())
    print(f"wheel built in {build_s:.1f} s")
    return wheel


def pip(venv: Path, *args: str | Path) -> subprocess.CompletedProcess:
    """This environment's pip acting on the venv at `venv` (`pip --python`): the venv's own copy of pip would
    be installed by ensurepip for every fresh venv, and is not what these tests are about."""
    return run(sys.executable, "-m", "pip", "--python", venv / "bin" / "python", *args, cwd=venv.parent)


def install(wheel: Path, venv: Path, extras: str = "") -> Path:
    """The wheel, with `extras` ("[all]") and the dependencies they declare, installed into the venv at `venv`
    (outside the repository), made fresh where there is none."""
    started = time.monotonic()
    if not venv.exists():
        run(sys.executable, "-m", "venv", "--without-pip", venv, cwd=venv.parent)
    options = ["install", "--quiet", "--no-compile"]
    # As docs/tutorial-federation-of-devices.md tells a device: the CPU build of torch first where PyTorch's
    # index is reachable (a plain torch requirement pulls a multi-GB CUDA build), then the wheel with the rest
    # of its dependencies.
    try:
        pip(venv, *options, "--no-deps", "--timeout", "10", "--retries", "0", TORCH_PIN,
            "--index-url", "https://download.pytorch.org/whl/cpu")
    except subprocess.CalledProcessError:
        pass  # unreachable here: the default index (or this machine's wheel cache) provides torch
    pip(venv, *options, f"{wheel}{extras}")
    print(f"installed {extras or 'the base'} in {time.monotonic() - started:.1f} s")
    return venv


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


def installed(venv: Path) -> set[str]:
    listed = json.loads(pip(venv, "list", "--format=json").stdout)
    return {p["name"].lower().replace("_", "-") for p in listed}


def assert_no_extra(venv: Path) -> None:
    """The venv still holds a device's install: its checks run before `venv` adds the extras (this file's order)."""
    (site,) = (venv / "lib").glob("python3*/site-packages")
    assert not (site / "fastapi").exists(), "the device's checks must run before the extras are added"


@pytest.fixture(scope="module")
def device(tmp_path_factory, wheel: Path) -> Path:
    """A fresh venv holding the wheel without extras: a device's install."""
    venv = install(wheel, tmp_path_factory.mktemp("wheel") / "venv")
    print(f"device venv: {site_packages_bytes(venv) / 2**20:.0f} MiB, "
          f"{site_packages_bytes(venv, ('torch',)) / 2**20:.0f} MiB without torch")
    return venv


@pytest.fixture(scope="module")
def venv(device: Path, wheel: Path) -> Path:
    """The device's venv with every extra added: the services' install."""
    return install(wheel, device, "[all]")


def test_a_device_install_holds_no_server_package(device):
    packages = installed(device)
    assert {"fl-services", "torch", "httpx", "pydantic", "safetensors", "typer"} <= packages
    assert not packages & NOT_ON_A_DEVICE, packages & NOT_ON_A_DEVICE


def test_a_device_install_answers_help(device):
    assert_no_extra(device)
    assert "FL_CLIENT_EDGE_URL" in run(device / "bin" / "fl-client", "--help", cwd=device.parent).stdout
    assert "FL_ADMIN_TOKEN" in run(device / "bin" / "fedctl", "--help", cwd=device.parent).stdout


@pytest.mark.parametrize("server", ["fl-cloud", "fl-edge"])
def test_a_device_install_says_what_a_server_needs(device, server):
    assert_no_extra(device)
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
    assert_no_extra(device)
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


def test_the_wheel_imports_from_its_own_venv_and_has_the_console_scripts(venv):
    code = ("import fl_services.cloud.main, fl_services.cloud.app, fl_services.edge.main, fl_services.edge.app, "
            "fl_services.client.main, "
            "fl_services.fedctl.__main__, "
            "fl_services.shared.core.algorithms; print(fl_services.client.__file__)")
    where = run(venv / "bin" / "python", "-c", code, cwd=venv.parent).stdout.strip()
    assert Path(where).is_relative_to(venv / "lib"), where
    for script in SCRIPTS:
        assert (venv / "bin" / script).is_file(), script
    assert "--clients" in run(venv / "bin" / "fl-client", "--help", cwd=venv.parent).stdout
    assert "client-token" in run(venv / "bin" / "fedctl", "--help", cwd=venv.parent).stdout


def test_an_installed_fl_client_takes_part_in_a_real_run(venv, tmp_path, monkeypatch):
    monkeypatch.delenv("PYTHONPATH", raising=False)
    config = RunConfig(name="wheel", rounds=3, model={"name": "logreg"}, data={"num_clients": 4})
    # Client process 0 (clients 0 and 2) is the wheel's fl-client; process 1 runs from this checkout.
    with LocalTopology(num_clients=4, num_edges=1, procs_per_edge=2, workdir=tmp_path,
                       client_programs={0: [str(venv / "bin" / "fl-client")]}) as topo,\
            CloudAPI(topo.cloud_url, topo.admin_token) as api:
        installed = topo.clients[0].proc
        assert Path(f"/proc/{installed.pid}/cwd").resolve() == tmp_path.resolve()
        assert b"PYTHONPATH=" not in Path(f"/proc/{installed.pid}/environ").read_bytes()
        info = api.create_run(config)
        api.action(info.run_id, "start")
        final = api.wait(info.run_id, timeout_s=600)
        assert final.status == RunStatus.finished and final.version == config.rounds
        history = api.history(info.run_id)
        model = api.model(info.run_id)
        assert topo.clients[0].alive()
    assert [sorted(c.client_id for c in h.clients) for h in history] == [[0, 1, 2, 3]] * config.rounds
    reference = run_reference(config)
    assert model.keys() == reference.global_state.keys()
    for name, tensor in reference.global_state.items():
        assert torch.allclose(model[name], tensor, atol=1e-5), name
