"""The model zoo's configurable mlp and a researcher's own factory (model.name = "package.module:factory")."""
import pytest
import torch
from torch import nn

from fl_services.shared.core.algorithms import registry
from fl_services.shared.core.algorithms.submodel import architecture_of, embed, extract, layer_windows
from fl_services.shared.core.config import ModelConfig, RunConfig
from fl_services.shared.core.models import CNN, build_model
from fl_services.shared.core.user_code import UserCodeError

FACTORIES = "tests.shared.user_factories"


def test_default_mlp_is_mcmahans_2nn_drawn_in_layer_order():
    model = build_model(ModelConfig(name="mlp"), (1, 8, 8), 10, seed=3)
    torch.manual_seed(3)
    expected = [nn.Linear(64, 200), nn.Linear(200, 200), nn.Linear(200, 10)]
    names = ["fc1", "fc2", "fc3"]
    assert [n for n, _ in model.named_children()] == names
    for name, layer in zip(names, expected, strict=True):
        assert torch.equal(getattr(model, name).weight, layer.weight)
        assert torch.equal(getattr(model, name).bias, layer.bias)


def test_flower_cnn_is_flowers_quickstart_net():
    """Flower's PyTorch quickstart CNN: 62,006 parameters on CIFAR's 3x32x32, 44,426 on MNIST's 1x28x28."""
    mnist = build_model(ModelConfig(name="flower_cnn"), (1, 28, 28), 10)
    shapes = {n: tuple(p.shape) for n, p in mnist.named_parameters()}
    assert shapes == {"conv1.weight": (6, 1, 5, 5), "conv1.bias": (6,), "conv2.weight": (16, 6, 5, 5),
                      "conv2.bias": (16,), "fc1.weight": (120, 256), "fc1.bias": (120,), "fc2.weight": (84, 120),
                      "fc2.bias": (84,), "fc3.weight": (10, 84), "fc3.bias": (10,)}
    cifar = build_model(ModelConfig(name="flower_cnn"), (3, 32, 32), 10)
    assert sum(p.numel() for p in cifar.parameters()) == 62_006 and cifar(torch.zeros(2, 3, 32, 32)).shape == (2, 10)
    with pytest.raises(ValueError, match="16x16"):
        build_model(ModelConfig(name="flower_cnn"), (1, 8, 8), 10)


def test_each_build_is_a_model_of_its_own_with_the_seeded_weights():
    """Built-in models are copies of one built per process: training one never changes the next."""
    first = build_model(ModelConfig(name="cnn"), (1, 28, 28), 10, seed=5)
    with torch.no_grad():
        for p in first.parameters():
            p.add_(1.0)
    second = build_model(ModelConfig(name="cnn"), (1, 28, 28), 10, seed=5)
    torch.manual_seed(5)
    fresh = CNN((1, 28, 28), 10)
    for (name, got), (_, want) in zip(second.named_parameters(), fresh.named_parameters(), strict=True):
        assert torch.equal(got, want), name
    assert not torch.equal(first.conv1.weight, second.conv1.weight)


def test_mlp_hidden_sizes_are_configurable():
    model = build_model(ModelConfig(name="mlp", hidden=(32, 16, 8)), (40,), 10)
    shapes = {n: tuple(p.shape) for n, p in model.named_parameters()}
    assert shapes == {"fc1.weight": (32, 40), "fc1.bias": (32,), "fc2.weight": (16, 32), "fc2.bias": (16,),
                      "fc3.weight": (8, 16), "fc3.bias": (8,), "fc4.weight": (10, 8), "fc4.bias": (10,)}
    assert model(torch.zeros(5, 40)).shape == (5, 10)


def test_fedrolex_rolls_an_mlp_of_any_depth():
    cfg = ModelConfig(name="mlp", hidden=(12, 6, 4))
    full = {n: p.detach() for n, p in build_model(cfg, (5,), 3).named_parameters()}
    shapes = {n: tuple(t.shape) for n, t in full.items()}
    arch = architecture_of(cfg)
    windows = layer_windows(arch, shapes, 0.5, round=1)
    sub = extract(full, arch, windows)
    narrow = build_model(cfg, (5,), 3, **arch.widths({n: tuple(t.shape) for n, t in sub.items()}))
    assert {n: tuple(p.shape) for n, p in narrow.named_parameters()} == {n: tuple(t.shape) for n, t in sub.items()}
    placed, masks = embed(sub, arch, windows, shapes)
    for name in full:
        assert torch.equal(placed[name][masks[name]], full[name][masks[name]])


def test_an_imported_factory_gets_the_shape_classes_and_options_under_the_seed():
    cfg = ModelConfig(name=f"{FACTORIES}:two_layer", options={"width": 7})
    a, b = (build_model(cfg, (2, 3), 4, seed=11) for _ in range(2))
    assert tuple(a[1].weight.shape) == (7, 6) and tuple(a[3].weight.shape) == (4, 7)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))
    other = build_model(cfg, (2, 3), 4, seed=12)
    assert not torch.equal(a[1].weight, other[1].weight)


@pytest.mark.parametrize("name, message", [
    (f"{FACTORIES}:not_a_module", "returned a str, not a torch nn.Module"),
    (f"{FACTORIES}:broken", "raised RuntimeError: the researcher's bug"),
    ("tests.shared.no_such_module:make", "No module named 'tests.shared.no_such_module'"),
])
def test_a_broken_factory_says_whose_and_what(name, message):
    with pytest.raises(UserCodeError, match=message):
        build_model(ModelConfig(name=name), (4,), 2)


@pytest.mark.parametrize("algorithm", ["fedrolex", "fedscavar"])
def test_an_imported_model_is_not_narrowed_and_sub_model_algorithms_refuse_it(algorithm):
    cfg = ModelConfig(name=f"{FACTORIES}:two_layer")
    with pytest.raises(ValueError, match="cannot be narrowed"):
        build_model(cfg, (4,), 2, hidden1=2)
    with pytest.raises(ValueError, match="sub-models need a built-in model"):
        registry.check(RunConfig(algorithm=algorithm, model=cfg, data={"dataset": "digits"}))


@pytest.mark.parametrize("fields, message", [
    ({"name": "resnet"}, "model.name must be one of logreg, mlp, cnn, flower_cnn or an import path"),
    ({"name": "pkg.models"}, "import path"),
    ({"name": "cnn", "options": {"width": 3}}, "model.options are the keyword arguments of an imported factory"),
    ({"name": "cnn", "hidden": [100]}, "model.hidden sets the mlp's hidden layers"),
    ({"name": "mlp", "hidden": [0]}, r"must lie in \[1, 100000\]"),
    ({"name": "mlp", "hidden": []}, "at least 1 item"),
    ({"name": "a.b:c", "options": {"x": [{"y": float("nan")}]}}, "finite number"),
])
def test_model_config_refuses(fields, message):
    with pytest.raises(ValueError, match=message):
        ModelConfig(**fields)


def test_json_overflowing_to_inf_in_options_is_refused():
    """JSON's 1e400 parses to inf past pydantic's finite check; stored, it would come back as null."""
    with pytest.raises(ValueError, match="model.options must hold finite numbers"):
        ModelConfig.model_validate_json('{"name": "a.b:c", "options": {"x": [1e400]}}')
    with pytest.raises(ValueError, match="data.options must hold finite numbers"):
        RunConfig.model_validate_json('{"data": {"dataset": "a.b:c", "options": {"x": {"y": -1e400}}}}')


def test_configs_with_options_are_hashable_and_equal_by_value():
    a = ModelConfig(name="a.b:c", options={"k": [1, {"x": 2}]})
    b = ModelConfig.model_validate_json(a.model_dump_json())
    assert a == b and hash(a) == hash(b)
    assert len({a, b, ModelConfig(name="a.b:c", options={"k": 1})}) == 2
