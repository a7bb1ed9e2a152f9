"""The half of a RunConfig's validation that needs the algorithm lives in the registry, so the plain config
model stays free of torch, and every place a run starts refuses a config with one kind of error."""
import json
import subprocess
import sys

import pytest
from pydantic import ValidationError

from fl_services.shared.core.algorithms import registry
from fl_services.shared.core.algorithms.base import NoParams
from fl_services.shared.core.algorithms.fedavg import FedAvg
from fl_services.shared.core.config import RunConfig
from fl_services.shared.core.reference import run_reference

SMALL = {"model": {"name": "logreg"}, "data": {"dataset": "digits", "num_clients": 4}, "rounds": 1}


def test_the_config_model_does_not_import_torch():
    # A fresh interpreter: this one has torch loaded by the other tests. A process that only reads configs
    # (fedctl, the edge's parsing) must not pay for importing the registry, every algorithm and torch.
    code = ("import json, sys\nimport fl_services.shared.core.config, fl_services.shared.wire\n"
            "fl_services.shared.core.config.RunConfig.model_validate({'algorithm': 'scaffold', 'params': {}})\n"
            "print(json.dumps([m for m in ('torch', 'fl_services.shared.core.algorithms.base', "
            "'fl_services.shared.core.algorithms.registry') "
            "if m in sys.modules]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert json.loads(out) == []


@pytest.mark.parametrize(
    ("change", "message"),
    # Every registered name, in order: a newly registered algorithm is listed too.
    [({"algorithm": "fedmagic"}, f"unknown algorithm 'fedmagic'; available: {', '.join(sorted(registry._MODULES))}"),
     ({"params": {"mu": 0.1}}, "Extra inputs are not permitted"),
     ({"algorithm": "fedprox", "params": {"mu": -1}}, "greater than or equal to 0"),
     ({"algorithm": "scaffold", "topology": {"num_edges": 2, "buffer_size": 1}}, "scaffold is synchronous")],
    ids=["unknown-algorithm", "foreign-param", "bad-param", "topology"],
)
def test_a_config_its_algorithm_refuses_is_refused_where_runs_start(change, message):
    config = RunConfig.model_validate({**SMALL, **change})  # the model alone cannot tell
    for refuse in (lambda: registry.parse_config({**SMALL, **change}), lambda: registry.check(config),
                   lambda: registry.create(config), lambda: run_reference(config)):
        with pytest.raises(ValidationError, match="1 validation error for RunConfig") as refused:
            refuse()
        assert message in str(refused.value)


def test_parse_config_reports_each_error_at_its_place_with_its_input():
    given = {**SMALL, "algorithm": "fedmagic"}
    with pytest.raises(ValidationError) as refused:
        registry.parse_config(given)
    assert [(e["type"], e["loc"], e["input"]) for e in refused.value.errors()] == [
        ("value_error", ("algorithm",), "fedmagic")]
    given = {**SMALL, "algorithm": "fedprox", "params": {"mu": -1}, "rounds": 0}  # the config's and its params'
    with pytest.raises(ValidationError) as refused:
        registry.parse_config(given)
    assert [(e["loc"], e["input"]) for e in refused.value.errors()] == [(("rounds",), 0), (("params", "mu"), -1)]
    given = {**SMALL, "algorithm": "scaffold", "aggregation": {"edge": "median"}}  # the algorithm's, at its field
    with pytest.raises(ValidationError) as refused:
        registry.parse_config(given)
    assert [(e["loc"], e["input"]) for e in refused.value.errors()] == [(("aggregation", "edge"), given)]
    given = {**SMALL, "model": {"name": "cnn"}, "data": {"dataset": "synthetic"}}  # the whole config's matter
    with pytest.raises(ValidationError) as refused:
        registry.parse_config(given)
    assert [(e["loc"], e["input"]) for e in refused.value.errors()] == [((), given)]


def test_an_accepted_config_is_returned_as_is():
    config = RunConfig(**SMALL, algorithm="fedprox", params={"mu": 0.1})
    assert registry.check(config) is config
    assert registry.parse_config(config.model_dump()) == config


@pytest.mark.parametrize(("algorithm", "buffer_size"), [("fedavg", 3), ("scaffold", 3), ("hfpl", 1)])
def test_buffer_size_left_out_is_num_edges_for_a_synchronous_algorithm(algorithm, buffer_size):
    given = {**SMALL, "algorithm": algorithm, "topology": {"num_edges": 3}}
    for config in (registry.parse_config(given), RunConfig.model_validate(given), RunConfig(**given)):
        assert config.topology.buffer_size == buffer_size
        assert registry.check(config) is config
    assert RunConfig.model_validate({**given, "topology": {"num_edges": 3, "buffer_size": 2}}).topology.buffer_size == 2


def test_a_stored_config_with_several_edges_reads_back_without_torch():
    # What the services read back holds buffer_size: the default needs no algorithm class there.
    stored = RunConfig.model_validate({**SMALL, "topology": {"num_edges": 2}}).model_dump_json()
    code = ("import sys\nfrom fl_services.shared.core.config import RunConfig\n"
            f"print(RunConfig.model_validate_json({stored!r}).topology.buffer_size, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["2", "False"]


class FedLater(FedAvg[NoParams]):
    """A model-averaging algorithm registered after the catalogue: it takes what FedAvg takes."""

    name = "fedlater"


@pytest.mark.parametrize(("change", "named"), [
    ({"algorithm": "scaffold", "secure_aggregation": {"edge": True}}, "fedavg, fedlater, fedprox and fedsgd take it"),
    ({"algorithm": "scaffold", "aggregation": {"edge": "median"}}, "fedavg, fedlater and fedprox do"),
    ({"algorithm": "scaffold", "policy": {"answers": 1, "late": "join"}}, "fedavg, fedlater, fedprox and fedsgd can"),
], ids=["secure-aggregation", "robust-aggregation", "late-join"])
def test_a_refusal_names_the_algorithms_that_take_the_option_a_newly_registered_one_included(monkeypatch, change,
                                                                                           named):
    monkeypatch.setitem(registry._MODULES, "fedlater", (__name__, "FedLater"))
    with pytest.raises(ValidationError) as refused:
        registry.parse_config({**SMALL, **change})
    assert named in str(refused.value)
