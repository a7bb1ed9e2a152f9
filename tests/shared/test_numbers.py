"""Every integer and number of the wire messages, RunConfig and the algorithms' params is JSON's: no boolean
for an integer (`{"edge_id": false}` was edge 0), no string for a number (shared/core/numbers.py)."""
from __future__ import annotations

import importlib
import pkgutil
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

import fl_services.shared.wire as wire
from fl_services.shared.core.algorithms import registry
from fl_services.shared.core.config import RunConfig, Strict
from fl_services.shared.core.data.summary import DataSummary, RunTask
from fl_services.shared.core.numbers import Float, Int
from fl_services.shared.core.reports import Message


def _subclasses(cls: type) -> set[type]:
    found = set(cls.__subclasses__())
    return found.union(*(_subclasses(c) for c in list(found)))


def _models() -> list[type[BaseModel]]:
    """What travels or configures a run: every Message and config model, a device's data summary, and each
    algorithm's Params."""
    for module in pkgutil.walk_packages(wire.__path__, wire.__name__ + "."):
        importlib.import_module(module.name)
    params = {registry.get_algorithm_class(name).Params for name in registry.available()}
    models = _subclasses(Message) | _subclasses(Strict) | params | {DataSummary, RunTask}
    return sorted((m for m in models if m.__module__.startswith("fl_services.")), key=lambda m: m.__qualname__)


def _lax_numbers(schema: Any, where: str) -> list[str]:
    """Where a core schema holds an int or float that is not strict (a dict's keys aside: JSON keys are strings;
    and user code's options, any JSON value, where true is the boolean it is)."""
    if isinstance(schema, list):
        return [hit for i, item in enumerate(schema) for hit in _lax_numbers(item, f"{where}[{i}]")]
    if not isinstance(schema, dict) or str(schema.get("ref", "")).startswith("pydantic.types.JsonValue"):
        return []
    if schema.get("type") in ("int", "float") and not schema.get("strict"):
        return [where]
    return [hit for key, item in schema.items() if key != "keys_schema" for hit in _lax_numbers(item, f"{where}.{key}")]


MODELS = _models()


def test_the_walk_finds_the_messages_and_configs():
    names = {m.__name__ for m in MODELS}
    assert {"RunConfig", "AggregationConfig", "EdgeRegistration", "ClientRegistration", "TaskPoll",
            "ClientParticipation", "DataSummary", "HFPLParams"} <= names


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.__name__)
def test_every_integer_and_number_is_strict(model: type[BaseModel]):
    assert _lax_numbers(model.__pydantic_core_schema__, model.__name__) == []


@pytest.mark.parametrize("value", [False, True, "1", 1.0])
def test_an_integer_takes_a_json_integer_alone(value: Any):
    with pytest.raises(ValidationError):
        RunConfig.model_validate({"rounds": value})
    with pytest.raises(ValidationError):
        RunConfig.model_validate_json(f'{{"aggregation": {{"krum_byzantine": {_json(value)}}}}}')
    assert RunConfig.model_validate({"rounds": 3}).rounds == 3


@pytest.mark.parametrize("value", [False, "0.5"])
def test_a_number_takes_any_json_number_but_no_boolean_or_string(value: Any):
    with pytest.raises(ValidationError):
        RunConfig.model_validate({"fraction": value})
    assert RunConfig.model_validate({"fraction": 1}).fraction == 1.0


def test_the_schema_still_says_integer_and_number():
    class Both(BaseModel):
        count: Int
        share: Float

    properties = Both.model_json_schema()["properties"]
    assert (properties["count"]["type"], properties["share"]["type"]) == ("integer", "number")


def _json(value: Any) -> str:
    return {False: "false", True: "true"}.get(value, repr(value).replace("'", '"')) if not isinstance(value, float) \
        else repr(value)
