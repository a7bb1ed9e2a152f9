"""pyproject.toml against the checkout: the package list covers every package directory, each console
script names a main() that exists, and requirements*.txt (what ./fl and the Dockerfiles install) say
what pyproject.toml says. The wheel itself is built and installed in tests/integration/test_wheel.py."""
from __future__ import annotations

import importlib
import tomllib
from pathlib import Path

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


def test_requirements_files_agree_with_pyproject():
    project = PYPROJECT["project"]
    assert requirement_lines("requirements.txt") == project["dependencies"]
    assert requirement_lines("requirements-dev.txt") == PYPROJECT["dependency-groups"]["dev"]
    assert (ROOT / "requirements-dev.txt").read_text().count("-r requirements.txt") == 1
    assert "torch==2.13.0" in project["dependencies"]
    assert PYPROJECT["build-system"]["build-backend"] == "setuptools.build_meta"
