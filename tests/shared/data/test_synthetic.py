"""FedProx's Synthetic(α, β) generator, checked against the distributions it claims to draw from."""
import numpy as np
import pytest

from fl_services.shared.core.config import MAX_SYNTHETIC_DEVICES, DataConfig
from fl_services.shared.core.data.synthetic import (
    MAX_DEVICE_SIZE,
    SyntheticDevices,
    covariance_diagonal,
    device_sizes,
    generate_synthetic,
)


def make(alpha: float, beta: float, seed: int, num_devices: int = 30, **kwargs: int) -> SyntheticDevices:
    return generate_synthetic(alpha, beta, num_devices, np.random.default_rng(seed), **kwargs)


def label_histograms(devices: SyntheticDevices) -> np.ndarray:
    return np.stack([np.bincount(y, minlength=10) / len(y) for y in devices.y])


def mean_pairwise_tv(histograms: np.ndarray) -> float:
    k = len(histograms)
    return float(
        np.mean([0.5 * np.abs(histograms[i] - histograms[j]).sum() for i in range(k) for j in range(i + 1, k)])
    )


def mean_label_entropy(devices: SyntheticDevices) -> float:
    entropies = []
    for p in label_histograms(devices):
        p = p[p > 0]
        entropies.append(-(p * np.log(p)).sum())
    return float(np.mean(entropies))


def test_shapes_dtypes_and_ranges() -> None:
    devices = make(1.0, 1.0, seed=0)
    assert len(devices.x) == len(devices.y) == 30
    assert devices.weights.shape == (30, 10, 60)
    assert devices.biases.shape == (30, 10)
    assert devices.means.shape == (30, 60)
    for x, y, n in zip(devices.x, devices.y, devices.sizes, strict=True):
        assert x.shape == (n, 60) and x.dtype == np.float64
        assert y.shape == (n,) and y.dtype == np.int64
        assert 50 <= n <= MAX_DEVICE_SIZE
        assert y.min() >= 0 and y.max() < 10


def test_same_generator_state_gives_same_data() -> None:
    first, again, other = make(0.5, 0.5, seed=7), make(0.5, 0.5, seed=7), make(0.5, 0.5, seed=8)
    for a, b in zip(first.x + first.y, again.x + again.y, strict=True):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(first.weights, again.weights)
    assert not np.array_equal(first.sizes, other.sizes)


def test_labels_are_the_argmax_of_each_device_model() -> None:
    devices = make(1.0, 1.0, seed=1)
    for k, (x, y) in enumerate(zip(devices.x, devices.y, strict=True)):
        logits = np.einsum("cj,nj->nc", devices.weights[k], x) + devices.biases[k]
        np.testing.assert_array_equal(y, logits.argmax(axis=1))


def test_device_sizes_follow_capped_lognormal_4_2() -> None:
    sizes = device_sizes(200_000, np.random.default_rng(0))
    assert sizes.min() >= 50 and sizes.max() == MAX_DEVICE_SIZE
    # floor(LN(4, 2)) has median floor(e^4) = 54 and quartiles floor(e^(4 ± 2·0.6745)) = 14, 210.
    assert np.percentile(sizes - 50, [25, 50, 75]) == pytest.approx([14, 54, 210], rel=0.04)
    # The cap binds where LN(4, 2) > 2950: P(Z > (ln 2950 - 4) / 2 = 1.995) = 0.0230.
    assert np.mean(sizes == MAX_DEVICE_SIZE) == pytest.approx(0.0230, abs=0.002)


def test_device_sizes_are_heterogeneous() -> None:
    sizes = make(1.0, 1.0, seed=0).sizes
    assert sizes.max() / sizes.min() > 10
    assert sizes.std() / sizes.mean() > 1  # power law: spread exceeds the mean


def test_alpha_and_beta_are_standard_deviations_of_the_device_priors() -> None:
    # With max_size=50 every device has 50 samples, so 4000 devices are cheap.
    alpha, beta = 2.0, 0.5
    devices = make(alpha, beta, seed=2, num_devices=4000, max_size=50)
    # mean of W_k's 610 entries (W and b share u_k) estimates u_k ~ N(0, α²) plus noise of var 1/610.
    u_hat = np.concatenate([devices.weights.reshape(4000, -1), devices.biases], axis=1).mean(axis=1)
    assert u_hat.std() == pytest.approx(np.sqrt(alpha**2 + 1 / 610), rel=0.05)
    # W_k entries scatter around u_k with unit variance.
    assert (devices.weights - u_hat[:, None, None]).std() == pytest.approx(1.0, rel=0.02)
    # mean of v_k's 60 entries estimates B_k ~ N(0, β²) plus noise of var 1/60.
    assert devices.means.mean(axis=1).std() == pytest.approx(np.sqrt(beta**2 + 1 / 60), rel=0.05)
    assert (devices.means - devices.means.mean(axis=1, keepdims=True)).std() == pytest.approx(1.0, rel=0.02)


def test_feature_covariance_is_diagonal_with_power_decay() -> None:
    devices = make(1.0, 1.0, seed=3)
    largest = int(devices.sizes.argmax())
    assert devices.sizes[largest] == MAX_DEVICE_SIZE
    residual = devices.x[largest] - devices.means[largest]
    variance = residual.var(axis=0)
    expected = np.arange(1, 61, dtype=np.float64) ** -1.2
    np.testing.assert_allclose(covariance_diagonal(), expected)
    # Each variance estimate from 3000 samples has relative sd sqrt(2/3000) = 2.6%; 4.5 sd allowed.
    np.testing.assert_allclose(variance / expected, 1.0, atol=0.12)
    slope = np.polyfit(np.log(np.arange(1, 61)), np.log(variance), 1)[0]
    assert slope == pytest.approx(-1.2, abs=0.03)
    # Off-diagonal correlations are sampling noise only (sd 1/sqrt(3000) = 0.018).
    corr = np.corrcoef(residual, rowvar=False)
    assert np.abs(corr - np.eye(60)).max() < 0.1


def test_alpha_does_not_change_inputs_or_labels() -> None:
    """u_k shifts every class's logit by the same u_k·(Σ_j x_j + 1) and argmax ignores a common
    shift, so with the same generator state only W_k and b_k change, never (x, y)."""
    small, large = make(0.0, 1.0, seed=4), make(3.0, 1.0, seed=4)
    for a, b in zip(small.x, large.x, strict=True):
        np.testing.assert_array_equal(a, b)
    agree = np.mean(np.concatenate(small.y) == np.concatenate(large.y))
    assert agree > 0.999  # float rounding could only flip exact ties


def test_beta_spreads_the_devices_inputs() -> None:
    """E‖v_k − v_j‖² = 2·60·(1 + β²): twice as far apart at β = 1 as at β = 0 (same normals)."""

    def spread(devices: SyntheticDevices) -> float:
        centres = np.stack([x.mean(axis=0) for x in devices.x])
        diffs = centres[:, None, :] - centres[None, :, :]
        return float((diffs**2).sum(axis=2)[np.triu_indices(len(centres), 1)].mean())

    for seed in range(3):
        homogeneous, heterogeneous = spread(make(0.0, 0.0, seed)), spread(make(1.0, 1.0, seed))
        assert homogeneous == pytest.approx(120, rel=0.2)
        assert heterogeneous > 1.4 * homogeneous


def test_devices_have_skewed_and_different_label_distributions() -> None:
    """Every device is dominated by a few classes (‖W_k v_k‖ dwarfs the feature noise), and devices
    disagree on which: pairwise TV ≈ 0.88 at both α = β = 0 and α = β = 1 (measured over 30 seeds:
    0.881 vs 0.885, so label-histogram TV barely separates the two). What β adds is concentration:
    a device's labels have lower entropy at β = 1 (0.34 vs 0.44 nats on average, lower in 28 of 30
    seeds), and its inputs move apart (test above)."""
    for seed in range(3):
        for ab in (0.0, 1.0):
            devices = make(ab, ab, seed)
            assert mean_pairwise_tv(label_histograms(devices)) > 0.75
            # The same samples dealt at random: histograms nearly equal.
            pooled = np.concatenate(devices.y)
            dealt = np.array_split(np.random.default_rng(seed).permutation(pooled), 30)
            assert mean_pairwise_tv(np.stack([np.bincount(y, minlength=10) / len(y) for y in dealt])) < 0.2
    entropy = {ab: np.mean([mean_label_entropy(make(ab, ab, seed)) for seed in range(5)]) for ab in (0.0, 1.0)}
    assert entropy[1.0] < entropy[0.0] - 0.05


def test_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="non-negative"):
        make(-1.0, 0.0, seed=0)
    with pytest.raises(ValueError, match="num_devices"):
        make(0.0, 0.0, seed=0, num_devices=0)
    with pytest.raises(ValueError, match="max_size"):
        make(0.0, 0.0, seed=0, max_size=10)


def test_config_bounds_the_devices_it_would_generate():
    """Its data grows with the devices: 100,000 of them would need about 50 GB in every process."""
    DataConfig(dataset="synthetic", num_clients=MAX_SYNTHETIC_DEVICES)
    with pytest.raises(ValueError, match="at most 1000 clients"):
        DataConfig(dataset="synthetic", num_clients=MAX_SYNTHETIC_DEVICES + 1)
    DataConfig(dataset="mnist5k", num_clients=100_000)  # a fixed data set only splits finer
