"""The installed package, the way a device meets it (docs/tutorial-federation-of-devices.md): the wheel
built from this checkout, installed into a fresh virtual environment outside the repository, and its
`fl-client` console script, started outside the repository with no PYTHONPATH, serving two of the four
clients of a real run that finishes on the in-process reference's model."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import tomllib
import zipfile
from pathlib import Path

import pytest
import torch

from fl_services.fedctl.api import CloudAPI
from fl_services.fedctl.launch import LocalTopology
from fl_services.shared.core.config import RunConfig
from fl_services.shared.core.reference import run_reference
from fl_services.shared.core.reports import RunStatus

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
    run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--wheel-dir", tmp / "dist", src, cwd=tmp)
    build_s = time.monotonic() - started
    (wheel,) = (tmp / "dist").glob("fl_services-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert sorted(n for n in names if ".dist-info/" not in n) == packaged_sources()
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    assert all(f"{script} = {target}" in zipfile.ZipFile(wheel).read(entry_points).decode()
               for script, target in SCRIPTS.items())
    print(f"wheel built in {build_s:.1f} s")
    return wheel


def install(wheel: Path, venv: Path, extras: str = "") -> Path:
    """A fresh venv at `venv` (outside the repository) holding the wheel, with `extras` ("[all]"), and the
    dependencies they declare."""
    started = time.monotonic()
    run(sys.executable, "-m", "venv", venv, cwd=venv.parent)
    pip = [venv / "bin" / "python", "-m", "pip", "install", "--quiet", "--no-compile"]
    # As docs/tutorial-federation-of-devices.md tells a device: the CPU build of torch first where PyTorch's
    # index is reachable (a plain torch requirement pulls a multi-GB CUDA build), then the wheel with the rest
    # of its dependencies.
    try:
        run(*pip, "--no-deps", "--timeout", "10", "--retries", "0", TORCH_PIN,
            "--index-url", "https://download.pytorch.org/whl/cpu", cwd=venv.parent)
    except subprocess.CalledProcessError:
        pass  # unreachable here: the default index (or this machine's wheel cache) provides torch
    run(*pip, f"{wheel}{extras}", cwd=venv.parent)
    print(f"installed into a fresh venv in {time.monotonic() - started:.1f} s")
    return venv


@pytest.fixture(scope="module")
def venv(tmp_path_factory, wheel: Path) -> Path:
    """A fresh venv (outside the repository) holding the wheel with every extra (the services' install)."""
    return install(wheel, tmp_path_factory.mktemp("wheel") / "venv", "[all]")


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
