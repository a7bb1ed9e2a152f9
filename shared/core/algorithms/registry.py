"""Algorithms by name. A new algorithm is a new module here plus one line below; no service changes.

Also the half of a RunConfig's validation that needs the algorithm's class (its name, its Params, its
`check_config`): `fl_services.shared.core.config` cannot make it without importing every algorithm, and torch with them.
"""
from __future__ import annotations

import importlib
from typing import Any

from pydantic import ValidationError
from pydantic_core import ErrorDetails, InitErrorDetails

from fl_services.shared.core.algorithms.base import Algorithm
from fl_services.shared.core.config import RunConfig

_MODULES = {
    "fedavg": ("fl_services.shared.core.algorithms.fedavg", "FedAvg"),
    "fedsgd": ("fl_services.shared.core.algorithms.fedsgd", "FedSGD"),
    "fedprox": ("fl_services.shared.core.algorithms.fedprox", "FedProx"),
    "scaffold": ("fl_services.shared.core.algorithms.scaffold", "Scaffold"),
    "fedvarp": ("fl_services.shared.core.algorithms.fedvarp", "FedVARP"),
    "clusterfedvarp": ("fl_services.shared.core.algorithms.clusterfedvarp", "ClusterFedVARP"),
    "fedrolex": ("fl_services.shared.core.algorithms.fedrolex", "FedRolex"),
    "fedscavar": ("fl_services.shared.core.algorithms.fedscavar", "FedSCAVAR"),
    "pfedme": ("fl_services.shared.core.algorithms.pfedme", "PFedMe"),
    "hfpl": ("fl_services.shared.core.algorithms.hfpl", "HFPL"),
}


def available() -> list[str]:
    return sorted(_MODULES)


def get_algorithm_class(name: str) -> type[Algorithm]:
    if name not in _MODULES:
        raise ValueError(f"unknown algorithm {name!r}; available: {', '.join(available())}")
    module, attr = _MODULES[name]
    cls: type[Algorithm] = getattr(importlib.import_module(module), attr)
    return cls


def parse_config(data: Any) -> RunConfig:
    """A RunConfig from untrusted input (a POSTed body, a config file), refused as a whole if its algorithm
    cannot run it: what the cloud answers 422 with and what fedctl reports."""
    return _checked(RunConfig.model_validate(data), data)


def check(config: RunConfig) -> RunConfig:
    """`config` itself if its algorithm exists and accepts its params and topology; else pydantic's
    ValidationError, worded as RunConfig's own errors (so every caller sees one kind of refusal)."""
    return _checked(config, config.model_dump())


def create(config: RunConfig) -> Algorithm:
    """The algorithm that runs `config`, which is checked first: no algorithm is built for a config it
    refuses (this is also where the reference runner starts)."""
    return get_algorithm_class(check(config).algorithm)(config)


def _checked(config: RunConfig, given: Any) -> RunConfig:
    errors: list[InitErrorDetails]
    try:
        cls = get_algorithm_class(config.algorithm)
        cls.Params.model_validate(config.params)
        cls.check_config(config)
        return config
    except ValidationError as exc:  # the Params model's own errors, passed on unchanged
        errors = [_details(e) for e in exc.errors(include_url=False)]
    except ValueError as exc:
        errors = [InitErrorDetails(type="value_error", loc=(), input=given, ctx={"error": exc})]
    raise ValidationError.from_exception_data(RunConfig.__name__, errors)


def _details(error: ErrorDetails) -> InitErrorDetails:
    details = InitErrorDetails(type=error["type"], loc=error["loc"], input=error["input"])
    if "ctx" in error:
        details["ctx"] = error["ctx"]
    return details
