"""Which imports a cloud allows, and what creation says about an imported model that does not fit."""
import pytest

from fl_services.cloud.initial_state import InvalidRun, initial_global
from fl_services.shared.core.config import RunConfig
from fl_services.shared.core.user_code import is_allowed

FACTORIES = "tests.shared.user_factories"


@pytest.mark.parametrize("path, prefixes, allowed", [
    ("mypkg.models:make", (), True),
    ("mypkg.models:make", ("mypkg",), True),
    ("mypkg:make", ("mypkg",), True),
    ("mypkg.models:make", ("mypkg.models",), True),
    ("mypkg_evil.models:make", ("mypkg",), False),
    ("os:system", ("mypkg", "lab.nets"), False),
    ("lab.nets.conv:make", ("mypkg", "lab.nets"), True),
])
def test_allowed_imports_are_packages_not_string_prefixes(path, prefixes, allowed):
    assert is_allowed(path, prefixes) is allowed


def create(**model) -> bytes:
    config = RunConfig(model=model, data={"dataset": "digits", "num_clients": 2})
    return initial_global("r", config, 2**29, 2**26, allowed_imports=("tests.shared",))


def test_creation_builds_an_imported_model_that_fits():
    assert create(name=f"{FACTORIES}:two_layer", options={"width": 3})


@pytest.mark.parametrize("model, message", [
    ({"name": f"{FACTORIES}:wrong_classes"}, r"maps one sample of shape \(1, 8, 8\) to \(1, 11\); it must give "
                                             r"logits of shape \(1, 10\)"),
    ({"name": f"{FACTORIES}:broken"}, "the model factory .* raised RuntimeError: the researcher's bug"),
    ({"name": f"{FACTORIES}:not_a_module"}, "returned a str"),
    ({"name": f"{FACTORIES}:nan_weights"}, r"starts with non-finite values in \['model/1.bias'\]"),
    ({"name": f"{FACTORIES}:exits"}, r"the model factory .* raised SystemExit: usage: train.py"),
    ({"name": "fl_services.shared.core.models:MLP"}, "outside the packages this cloud may import .*tests.shared"),
])
def test_creation_refuses_an_imported_model_that_does_not(model, message):
    with pytest.raises(InvalidRun, match=message):
        create(**model)


def test_creation_refuses_a_loader_that_exits():
    config = RunConfig(model={"name": "logreg"}, data={"dataset": f"{FACTORIES}:exiting_loader", "num_clients": 2})
    with pytest.raises(InvalidRun, match=r"the data loader .* raised SystemExit: 2"):
        initial_global("r", config, 2**29, 2**26)
