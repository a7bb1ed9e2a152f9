"""A package's public names loaded on first use (PEP 562): the package lists them in `__all__` and says which
submodule holds each, so importing one light submodule (a config, a summary) does not import the heavy ones
(torch, the data sets) that the package's other names need."""
from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def exports(package: str, homes: Mapping[str, str]) -> Callable[[str], Any]:
    """The package's module `__getattr__`: `homes` maps each public name to its submodule (relative)."""

    def __getattr__(name: str) -> Any:
        if name not in homes:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(f"{package}.{homes[name]}"), name)

    return __getattr__
