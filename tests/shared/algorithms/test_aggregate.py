import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fl_services.shared.core.algorithms import aggregate, fused


def test_weighted_mean_by_hand():
    # weights 1 and 3: mean = (1*[1, 2] + 3*[5, 6]) / 4 = [4, 5]
    partial = aggregate.reduce([(1.0, {"g": {"x": torch.tensor([1.0, 2.0])}}),
                                (3.0, {"g": {"x": torch.tensor([5.0, 6.0])}})])
    assert partial.weight == 4.0
    assert torch.equal(aggregate.mean(partial)["g"]["x"], torch.tensor([4.0, 5.0], dtype=torch.float64))


@settings(max_examples=50, deadline=None)
@given(
    st.lists(st.tuples(st.floats(0.1, 100), st.lists(st.floats(-10, 10), min_size=3, max_size=3)),
             min_size=2, max_size=8),
    st.integers(1, 7),
)
def test_partials_are_associative(items, cut):
    """combine([reduce(all)]) == combine([reduce(a), reduce(b)]): hierarchical equals flat."""
    cut = min(cut, len(items) - 1)
    items = [(w, {"g": {"x": torch.tensor(v)}}) for w, v in items]
    flat = aggregate.mean(aggregate.reduce(items))
    split = aggregate.mean(aggregate.combine([aggregate.reduce(items[:cut]), aggregate.reduce(items[cut:])]))
    assert torch.allclose(flat["g"]["x"], split["g"]["x"], rtol=1e-12, atol=1e-12)


def test_add_scaled_keeps_dtype():
    base = {"w": torch.ones(2)}
    out = aggregate.add_scaled(base, {"w": torch.tensor([2.0, 4.0], dtype=torch.float64)}, 0.5)
    assert out["w"].dtype == torch.float32 and torch.equal(out["w"], torch.tensor([2.0, 3.0]))


@pytest.mark.parametrize("kernel", ["fused", "torch"])
def test_reduce_in_place_is_bit_identical_to_the_plain_sum_of_float64_products(kernel, monkeypatch):
    """The in-place, chunked accumulate rounds as `sum + x.double() * w` does, across chunk boundaries and
    for any shape and dtype of x (here a tensor larger than one chunk and a non-contiguous one), through the
    fused kernel (numba, when installed) and through torch's ops alike."""
    if kernel == "torch":
        monkeypatch.setattr(fused, "kernels", lambda: None)
    elif fused.kernels() is None:
        pytest.skip("numba is not installed")
    generator = torch.Generator().manual_seed(0)
    big = aggregate._CHUNK * 2 + 17
    items = [(float(w), {"m": {"big": torch.randn(big, generator=generator),
                               "t": torch.randn(5, 3, generator=generator).T,
                               "h": torch.randn(7, generator=generator).half()}})
             for w in (3.0, 0.1, 7.25, 1e-3, 2.5, -0.75)]
    expected: dict[str, torch.Tensor] = {}
    for w, record in items:
        for name, x in record["m"].items():
            term = x.to(torch.float64) * w
            expected[name] = expected[name] + term if name in expected else term
    got = aggregate.reduce(items)
    assert got.weight == sum(w for w, _ in items)
    for name, value in expected.items():
        assert got.sums["m"][name].dtype == torch.float64 and torch.equal(got.sums["m"][name], value), name
