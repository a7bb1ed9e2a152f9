"""Rolling windows, extraction and embedding against indices and numbers worked out by hand."""
import pytest
import torch

from fl_services.shared.core.algorithms.submodel import (
    ARCHITECTURES,
    coverage,
    embed,
    extract,
    layer_windows,
    window_indices,
    window_size,
)
from fl_services.shared.core.config import ModelConfig
from fl_services.shared.core.models import build_model

MLP, CNN = ARCHITECTURES["mlp"], ARCHITECTURES["cnn"]


@pytest.mark.parametrize("units, capacity, round, expected", [
    (5, 0.6, 0, [0, 1, 2]),  # ⌊0.6·5⌋ = 3 units from 0
    (5, 0.6, 4, [4, 0, 1]),  # from 4, wrapping around
    (5, 0.6, 7, [2, 3, 4]),  # 7 mod 5 = 2
    (5, 0.6, 13, [3, 4, 0]),  # 13 mod 5 = 3
    (5, 0.1, 3, [3]),  # ⌊0.5⌋ = 0 → at least one unit
    (4, 1.0, 2, [2, 3, 0, 1]),  # full capacity: every unit, rolled
    (200, 0.25, 190, list(range(190, 200)) + list(range(40))),  # 50 units from 190
])
def test_window_indices_by_hand(units, capacity, round, expected):
    assert window_indices(units, capacity, round) == expected


def test_window_size_floors_without_float_surprises():
    assert window_size(100, 0.29) == 29  # 0.29·100 = 28.999999999999996 in floating point
    assert window_size(200, 0.5) == 100 and window_size(200, 0.25) == 50 and window_size(3, 0.5) == 1
    for bad in (0.0, -0.5, 1.5):
        with pytest.raises(ValueError, match="capacity"):
            window_size(10, bad)


def _mlp(k1: int = 5, k2: int = 4, inputs: int = 2, classes: int = 2) -> dict[str, torch.Tensor]:
    shapes = {"fc1.weight": (k1, inputs), "fc1.bias": (k1,), "fc2.weight": (k2, k1), "fc2.bias": (k2,),
              "fc3.weight": (classes, k2), "fc3.bias": (classes,)}
    return {n: torch.arange(float(torch.Size(s).numel())).view(s) for n, s in shapes.items()}


def test_layer_windows_are_sorted_per_layer():
    # fc1: K=5, ⌊2.5⌋ = 2 units from 3 → {3, 4}; fc2: K=4, 2 units from 3 → {3, 0}, kept sorted.
    windows = layer_windows(MLP, {n: tuple(t.shape) for n, t in _mlp().items()}, 0.5, 3)
    assert windows["fc1"].tolist() == [3, 4] and windows["fc2"].tolist() == [0, 3]


def test_mlp_extract_by_hand():
    full = _mlp()
    windows = {"fc1": torch.tensor([3, 4]), "fc2": torch.tensor([0, 3])}
    sub = extract(full, MLP, windows)
    # fc1.weight = arange(10).view(5, 2): rows 3, 4, the input stays whole.
    assert torch.equal(sub["fc1.weight"], torch.tensor([[6.0, 7.0], [8.0, 9.0]]))
    assert torch.equal(sub["fc1.bias"], torch.tensor([3.0, 4.0]))
    # fc2.weight = arange(20).view(4, 5): rows {0, 3} (fc2's window), columns {3, 4} (fc1's window).
    assert torch.equal(sub["fc2.weight"], torch.tensor([[3.0, 4.0], [18.0, 19.0]]))
    assert torch.equal(sub["fc2.bias"], torch.tensor([0.0, 3.0]))
    # fc3.weight = arange(8).view(2, 4): every output row, columns {0, 3}.
    assert torch.equal(sub["fc3.weight"], torch.tensor([[0.0, 3.0], [4.0, 7.0]]))
    assert torch.equal(sub["fc3.bias"], torch.tensor([0.0, 1.0]))
    assert all(t.is_contiguous() for t in sub.values())
    assert MLP.widths({n: tuple(t.shape) for n, t in sub.items()}) == {"hidden1": 2, "hidden2": 2}


def test_mlp_embed_round_trip_and_masks():
    full = _mlp()
    shapes = {n: tuple(t.shape) for n, t in full.items()}
    windows = {"fc1": torch.tensor([3, 4]), "fc2": torch.tensor([0, 3])}
    placed, masks = embed(extract(full, MLP, windows), MLP, windows, shapes)
    expected_fc2 = torch.zeros(4, 5, dtype=torch.bool)
    expected_fc2[0, 3] = expected_fc2[0, 4] = expected_fc2[3, 3] = expected_fc2[3, 4] = True
    assert torch.equal(masks["fc2.weight"], expected_fc2)
    assert masks["fc1.weight"].sum() == 4 and masks["fc1.weight"][3:].all()  # rows 3, 4, both inputs
    assert torch.equal(masks["fc3.bias"], torch.tensor([True, True]))  # the output stays whole
    assert torch.equal(masks["fc3.weight"], torch.tensor([[True, False, False, True]] * 2))
    for name, t in full.items():
        assert torch.equal(placed[name], torch.where(masks[name], t, 0.0))
        assert torch.equal(coverage(MLP, windows, shapes)[name], masks[name])
    with pytest.raises(ValueError, match="window has shape"):
        embed({"fc1.bias": torch.zeros(3)}, MLP, windows, shapes)


def test_full_capacity_extracts_the_model_itself():
    full = _mlp()
    windows = layer_windows(MLP, {n: tuple(t.shape) for n, t in full.items()}, 1.0, 3)
    sub = extract(full, MLP, windows)
    assert all(torch.equal(sub[n], full[n]) for n in full)


def test_logreg_has_nothing_to_roll():
    full = {"linear.weight": torch.ones(3, 4), "linear.bias": torch.ones(3)}
    windows = layer_windows(ARCHITECTURES["logreg"], {n: tuple(t.shape) for n, t in full.items()}, 0.25, 7)
    assert windows == {}
    assert all(torch.equal(extract(full, ARCHITECTURES["logreg"], windows)[n], full[n]) for n in full)


def _cnn_model(**widths):
    return build_model(ModelConfig(name="cnn"), (1, 8, 8), 2, 0, **widths)


def test_cnn_fc1_columns_follow_conv2_filters_in_blocks():
    # 8x8 input, two 2x2 pools → S = 2·2 = 4 positions per conv2 filter; fc1.weight is [5, 4·4].
    full = {n: p.detach().clone() for n, p in _cnn_model(conv1=3, conv2=4, hidden=5).named_parameters()}
    full["fc1.weight"] = torch.arange(80.0).view(5, 16)
    shapes = {n: tuple(t.shape) for n, t in full.items()}
    # β = ½, r = 1: conv1 ⌊1.5⌋ = 1 filter {1}; conv2 2 filters {1, 2}; fc1 2 units {1, 2}.
    windows = layer_windows(CNN, shapes, 0.5, 1)
    assert {k: v.tolist() for k, v in windows.items()} == {"conv1": [1], "conv2": [1, 2], "fc1": [1, 2]}
    sub = extract(full, CNN, windows)
    # Row 1 is 16..31, row 2 is 32..47; filters 1, 2 are features 4..11 (channel-major flatten).
    assert torch.equal(sub["fc1.weight"], torch.cat([torch.arange(20.0, 28.0), torch.arange(36.0, 44.0)]).view(2, 8))
    assert torch.equal(sub["conv2.weight"], full["conv2.weight"][1:3, 1:2])
    assert torch.equal(sub["conv1.weight"], full["conv1.weight"][1:2])
    assert torch.equal(sub["fc2.weight"], full["fc2.weight"][:, 1:3])
    assert CNN.widths({n: tuple(t.shape) for n, t in sub.items()}) == {"conv1": 1, "conv2": 2, "hidden": 2}
    _, masks = embed(sub, CNN, windows, shapes)
    expected = torch.zeros(5, 16, dtype=torch.bool)
    expected[1:3, 4:12] = True
    assert torch.equal(masks["fc1.weight"], expected)


def test_cnn_sub_model_computes_the_full_model_with_dropped_units_silenced():
    """An independent check of the block layout: the narrow net equals the full net whose weights
    reading from units outside the windows are zeroed (written here with reshapes, not indices)."""
    full_model = _cnn_model(conv1=3, conv2=4, hidden=5)
    full = {n: p.detach().clone() for n, p in full_model.named_parameters()}
    windows = layer_windows(CNN, {n: tuple(t.shape) for n, t in full.items()}, 0.5, 1)
    sub = extract(full, CNN, windows)
    sub_model = _cnn_model(**CNN.widths({n: tuple(t.shape) for n, t in sub.items()}))
    with torch.no_grad():
        for n, p in sub_model.named_parameters():
            p.copy_(sub[n])
        params = dict(full_model.named_parameters())
        params["conv2.weight"][:, [0, 2]] = 0  # conv1 keeps filter 1 only
        params["fc1.weight"].view(5, 4, 4)[:, [0, 3]] = 0  # conv2 keeps filters 1, 2: [unit, channel, position]
        params["fc2.weight"][:, [0, 3, 4]] = 0  # fc1 keeps units 1, 2
    x = torch.randn(6, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.allclose(sub_model(x), full_model(x), atol=1e-6)
