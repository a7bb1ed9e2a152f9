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
from fl_services.shared.core.config import ConfigError, RunConfig

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
    cannot run it: what the cloud answers 422 with and what fedctl reports. Every error at once, each at its
    place: the config's own fields and, read from the same input, its algorithm and params."""
    try:
        config = RunConfig.model_validate(data)
    except ValidationError as exc:
        errors = [_details(e) for e in exc.errors(include_url=False)]
        raise ValidationError.from_exception_data(RunConfig.__name__, errors + _algorithm_errors(data)) from None
    return _checked(config, data)


def _algorithm_errors(data: Any) -> list[InitErrorDetails]:
    """The errors of the input's algorithm name and params, where they can be read (RunConfig says the rest)."""
    name = data.get("algorithm", "fedavg") if isinstance(data, dict) else None
    params = data.get("params", {}) if isinstance(data, dict) else None
    if not isinstance(name, str) or not isinstance(params, dict):
        return []
    try:
        get_algorithm_class(name).Params.model_validate(params)
    except ValidationError as exc:
        return [_details(e, ("params",)) for e in exc.errors(include_url=False)]
    except ValueError as exc:
        return [InitErrorDetails(type="value_error", loc=("algorithm",), input=name, ctx={"error": exc})]
    return []


def check(config: RunConfig) -> RunConfig:
    """`config` itself if its algorithm exists and accepts its params and topology; else pydantic's
    ValidationError, worded as RunConfig's own errors (so every caller sees one kind of refusal)."""
    return _checked(config, config.model_dump())


def create(config: RunConfig) -> Algorithm:
    """The algorithm that runs `config`, which is checked first: no algorithm is built for a config it
    refuses (this is also where the reference runner starts)."""
    return get_algorithm_class(check(config).algorithm)(config)


def _checked(config: RunConfig, given: Any) -> RunConfig:
    errors = _algorithm_errors(config.model_dump())
    if not errors:
        try:
            get_algorithm_class(config.algorithm).check_config(config)
            return config
        except ValueError as exc:  # where the config is wrong, if the check said so (ConfigError)
            errors = [InitErrorDetails(type="value_error", loc=getattr(exc, "loc", ()), input=given,
                                       ctx={"error": exc})]
    raise ValidationError.from_exception_data(RunConfig.__name__, errors)


def _details(error: ErrorDetails, under: tuple[str | int, ...] = ()) -> InitErrorDetails:
    """`error` as pydantic raises it again, at `under` + its place, or at the field a ConfigError names."""
    located = error.get("ctx", {}).get("error")
    loc = (*under, *error["loc"], *(located.loc if isinstance(located, ConfigError) else ()))
    details = InitErrorDetails(type=error["type"], loc=loc, input=error["input"])
    if "ctx" in error:
        details["ctx"] = error["ctx"]
    return details
