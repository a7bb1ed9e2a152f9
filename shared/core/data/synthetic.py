"""FedProx's Synthetic(α, β) generator (Li et al. 2020, "Federated Optimization in Heterogeneous
Networks", §5.1 and `data/synthetic_*/generate_synthetic.py` in their repository).

For device k (0 <= k < K):

    u_k ~ N(0, α²)          W_k ∈ R^{10×60}, entries ~ N(u_k, 1)     b_k ∈ R^10, entries ~ N(u_k, 1)
    B_k ~ N(0, β²)          v_k ∈ R^60, entries ~ N(B_k, 1)
    x ~ N(v_k, Σ),  Σ = diag(j^-1.2 for j = 1..60)
    y = argmax softmax(W_k x + b_k) = argmax (W_k x + b_k)

α and β are standard deviations, as `np.random.normal(0, alpha)` in their generator (the paper writes
N(0, α); the two agree at the α = β ∈ {0, 1} the paper uses). Device sizes follow their power law,
n_k = floor(lognormal(4, 2)) + 50, except that the lognormal part is capped at `max_size` - 50 so a
device never exceeds `max_size` (3000 by default) samples: uncapped, one device in ~200 gets more than
10k samples and one in ~12k more than 100k, so a single device could dominate memory and run time. The
cap binds for ~2.3% of devices; n_k ∈ [50, 3000], and 30 devices hold ~9.5k samples on average (5-95%:
5k-15k), with the largest device typically ~50x the smallest. Features are not normalised, as in the paper.

Deliberate differences from their script, none of which changes the distribution of the data:
- randomness comes from the caller's `numpy.random.Generator`, never the global generator; the draws
  come in the same order (sizes, u, B, every v_k, then per device W_k, b_k, its x), but the exact
  numbers differ from theirs because x is drawn as v_k + sqrt(diag Σ) ⊙ z rather than through
  `multivariate_normal` (equal in distribution since Σ is diagonal);
- the label is the argmax of the logits; softmax is monotone so this is their label.
The train/test split (theirs: 90/10 per device) is not done here; see `fl_services.shared.core.data.federated`.

A property of the construction worth knowing when reading results: the u_k shift adds the same
u_k·(Σ_j x_j + 1) to every class's logit, and argmax ignores a common shift, so α does not change the
(x, y) distribution at all; with a fixed generator state, Synthetic(α, β) and Synthetic(α', β) give the
same labels (up to floating-point ties). All label heterogeneity across devices comes from v_k (β and
the per-device N(B_k, 1) draw) and from the per-device W_k, b_k.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

DIMENSION = 60
NUM_CLASSES = 10
MIN_DEVICE_SIZE = 50
MAX_DEVICE_SIZE = 3000


@dataclass(frozen=True)
class SyntheticDevices:
    """Each device's samples and the parameters that generated them (kept for tests and analysis)."""

    x: list[np.ndarray]  # per device, float64 (n_k, 60)
    y: list[np.ndarray]  # per device, int64 (n_k,)
    weights: np.ndarray  # W_k, float64 (K, 10, 60)
    biases: np.ndarray  # b_k, float64 (K, 10)
    means: np.ndarray  # v_k, float64 (K, 60)

    @property
    def sizes(self) -> np.ndarray:
        return np.array([len(y) for y in self.y], dtype=np.int64)


def covariance_diagonal(dimension: int = DIMENSION) -> np.ndarray:
    """Σ_jj = j^-1.2 for j = 1..dimension: later features carry less variance."""
    return np.arange(1, dimension + 1, dtype=np.float64) ** -1.2


def device_sizes(
    num_devices: int, rng: np.random.Generator, max_size: int = MAX_DEVICE_SIZE
) -> np.ndarray:
    """Power-law sizes floor(lognormal(4, 2)) + 50, the lognormal part capped at max_size - 50."""
    if max_size < MIN_DEVICE_SIZE:
        raise ValueError(f"max_size must be at least {MIN_DEVICE_SIZE}, got {max_size}")
    # Capped before the integer cast: lognormal(4, 2) occasionally exceeds what int64 could hold.
    extra = np.minimum(rng.lognormal(4.0, 2.0, num_devices), max_size - MIN_DEVICE_SIZE)
    return np.floor(extra).astype(np.int64) + MIN_DEVICE_SIZE


def generate_synthetic(
    alpha: float,
    beta: float,
    num_devices: int,
    rng: np.random.Generator,
    max_size: int = MAX_DEVICE_SIZE,
) -> SyntheticDevices:
    """Draw Synthetic(alpha, beta) for `num_devices` devices; a pure function of its arguments."""
    if alpha < 0 or beta < 0:
        raise ValueError(f"alpha and beta must be non-negative, got {alpha} and {beta}")
    if num_devices < 1:
        raise ValueError(f"num_devices must be at least 1, got {num_devices}")
    sizes = device_sizes(num_devices, rng, max_size)
    u = rng.normal(0.0, alpha, num_devices)
    shift = rng.normal(0.0, beta, num_devices)
    means = np.stack([rng.normal(shift[k], 1.0, DIMENSION) for k in range(num_devices)])
    scale = np.sqrt(covariance_diagonal())

    xs: list[np.ndarray] = []
    ys: list[np.ndarray] = []
    weights = np.empty((num_devices, NUM_CLASSES, DIMENSION))
    biases = np.empty((num_devices, NUM_CLASSES))
    for k in range(num_devices):
        # Drawn as (60, 10) like their x·W, so the draw order matches; stored as W_k = that transposed.
        weights[k] = rng.normal(u[k], 1.0, (DIMENSION, NUM_CLASSES)).T
        biases[k] = rng.normal(u[k], 1.0, NUM_CLASSES)
        x = means[k] + scale * rng.standard_normal((int(sizes[k]), DIMENSION))
        xs.append(x)
        ys.append(np.argmax(x @ weights[k].T + biases[k], axis=1).astype(np.int64))
    return SyntheticDevices(x=xs, y=ys, weights=weights, biases=biases, means=means)
