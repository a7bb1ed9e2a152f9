"""Optional dependencies: the distribution's base is what a device needs to train; the servers, the data-set
packages, DP and plotting are extras (pyproject.toml's optional-dependencies). Their modules are imported where
they are used, through `optional`, so that a device without them says which extra to install."""
from __future__ import annotations

import importlib
from types import ModuleType


class MissingExtra(ModuleNotFoundError):
    """A module of an extra that is not installed: the message names the extra."""


def optional(module: str, extra: str, needed_for: str) -> ModuleType:
    """`module`, imported; if it is not installed, MissingExtra saying `needed_for` needs `extra`."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        package = (exc.name or module).split(".")[0]
        raise MissingExtra(f"{needed_for} needs {package}, which is not installed: pip install "
                           f"'fl-services[{extra}]'", name=package) from None
