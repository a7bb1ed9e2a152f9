"""Optional dependencies: the distribution's base is what a device needs to train; the servers, the data-set
packages, DP and plotting are extras (pyproject.toml's optional-dependencies). Their modules are imported where
they are used, through `optional`, so that a device without them says which extra to install."""
from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Iterable
from types import ModuleType

# What the servers (fl-cloud, fl-edge) import of the `server` extra, by import name; numba is left out: without it
# the edges' weighted sum runs on torch's ops.
SERVER_MODULES = ("fastapi", "uvicorn", "httptools", "redis", "prometheus_client", "limits")


class MissingExtra(ModuleNotFoundError):
    """A module of an extra that is not installed: the message names the extra."""


def optional(module: str, extra: str, needed_for: str) -> ModuleType:
    """`module`, imported; if it is not installed, MissingExtra saying `needed_for` needs `extra`."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        package = (exc.name or module).split(".")[0]
        raise MissingExtra(_needs(needed_for, package, extra), name=package) from None


def require(modules: Iterable[str], extra: str, needed_for: str) -> None:
    """Exits (status 1) with a line naming `extra` where one of `modules` is not installed, found without importing
    any: for a command line, before it imports what needs them."""
    missing = [module for module in modules if not _installed(module)]
    if missing:
        raise SystemExit(_needs(needed_for, missing[0], extra))


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # what an import hook that refuses it raises
        return False


def _needs(needed_for: str, package: str, extra: str) -> str:
    return f"{needed_for} needs {package}, which is not installed: pip install 'fl-services[{extra}]'"
