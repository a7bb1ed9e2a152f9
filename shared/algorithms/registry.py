"""Algorithms by name. A new algorithm is a new module here plus one line below; no service changes."""
from __future__ import annotations

import importlib

from shared.algorithms.base import Algorithm

_MODULES = {
    "fedavg": ("shared.algorithms.fedavg", "FedAvg"),
    "fedsgd": ("shared.algorithms.fedsgd", "FedSGD"),
    "fedprox": ("shared.algorithms.fedprox", "FedProx"),
    "scaffold": ("shared.algorithms.scaffold", "Scaffold"),
    "fedvarp": ("shared.algorithms.fedvarp", "FedVARP"),
    "clusterfedvarp": ("shared.algorithms.clusterfedvarp", "ClusterFedVARP"),
    "fedrolex": ("shared.algorithms.fedrolex", "FedRolex"),
    "fedscavar": ("shared.algorithms.fedscavar", "FedSCAVAR"),
    "pfedme": ("shared.algorithms.pfedme", "PFedMe"),
    "hfpl": ("shared.algorithms.hfpl", "HFPL"),
}


def available() -> list[str]:
    return sorted(_MODULES)


def get_algorithm_class(name: str) -> type[Algorithm]:
    if name not in _MODULES:
        raise ValueError(f"unknown algorithm {name!r}; available: {', '.join(available())}")
    module, attr = _MODULES[name]
    return getattr(importlib.import_module(module), attr)


def create(config) -> Algorithm:
    return get_algorithm_class(config.algorithm)(config)
