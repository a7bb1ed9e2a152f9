"""Federated datasets: a global held-out set plus one train/test split per client.

Everything here is a deterministic function of (DataConfig, seed), so the cloud, every edge and every client
can rebuild the same partition locally instead of shipping data around. The data set is one of the built-in
ones (`builtin`), an npz file or the researcher's own loader (`supplied`).

Each client holds out a seeded `client_holdout` share (default 20%) of its samples as its own test split;
training and the weights p_k use the rest (0: every sample trains). The global test set is a
seeded `test_fraction` of the pooled data, held out before partitioning, except under the synthetic
generator's "natural" partition, where it is the union of the clients' held-out splits (see
`_synthetic_natural`).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import torch

from fl_services.shared.core.config import DataConfig, is_import_path
from fl_services.shared.core.data import builtin, partition, supplied, tags
from fl_services.shared.core.data.arrays import ArrayDataset, ClientData, Pool, hold_out, to_dataset
from fl_services.shared.core.data.synthetic import DIMENSION as _SYNTHETIC_DIMENSION
from fl_services.shared.core.data.synthetic import NUM_CLASSES as _SYNTHETIC_CLASSES


@dataclass(frozen=True)
class FederatedData:
    """All clients plus the pooled global test set.

    Instances are shared through a cache: treat the tensors as read-only.
    """

    clients: list[ClientData]
    test: ArrayDataset
    num_classes: int
    input_shape: tuple[int, ...]


def few_shot_arrays(name: str, num_clients: int, seed: int, test_fraction: float = 0.2, ways: tuple[int, int] = (2, 5),
                    max_shots: int = 50) -> dict[str, np.ndarray]:
    """FedProto's few-shot split of a bundled dataset (partition.few_shot_classes) as the arrays of an npz
    file for partition "file": x_train and y_train (each client's samples, client by client), client_train
    (their client ids), and x_test, y_test (the `test_fraction` held out of the pool before dealing, as for
    every bundled dataset)."""
    pool = builtin.bundled_pool(name, test_fraction, seed)
    parts, _ = partition.few_shot_classes(pool.y_train, num_clients, np.random.default_rng([seed, tags.PARTITION]),
                                          ways, max_shots)
    rows = np.concatenate(parts)
    client = np.repeat(np.arange(num_clients, dtype=np.int64), [len(p) for p in parts])
    return {"x_train": pool.x_train[rows], "y_train": pool.y_train[rows], "client_train": client,
            "x_test": pool.x_test, "y_test": pool.y_test}


def _partition(cfg: DataConfig, pool: Pool, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng([seed, tags.PARTITION])
    if cfg.partition == "iid":
        return partition.iid(len(pool.y_train), cfg.num_clients, rng)
    if cfg.partition == "dirichlet":
        return partition.dirichlet(pool.y_train, cfg.num_clients, cfg.alpha, rng)
    if cfg.partition == "shards":
        return partition.shards(pool.y_train, cfg.num_clients, cfg.shards_per_client, rng)
    if pool.client_train is None:
        raise ValueError(f"partition 'file' needs a client_train array in {cfg.path or cfg.dataset}")
    return partition.from_client_index(pool.client_train, cfg.num_clients)


def _client_split(indices: np.ndarray, seed: int, k: int, holdout: float) -> tuple[np.ndarray, np.ndarray]:
    return hold_out(indices, holdout, np.random.default_rng([seed, tags.CLIENT_SPLIT, k]))


def _client_data(pool: Pool, indices: np.ndarray, seed: int, k: int, holdout: float) -> ClientData:
    train, test = _client_split(indices, seed, k, holdout)
    return ClientData(
        train=to_dataset(pool.x_train[train], pool.y_train[train]),
        test=to_dataset(pool.x_train[test], pool.y_train[test]),
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
    x, y, device = builtin.synthetic_devices(cfg, seed)
    splits = [
        _client_split(part, seed, k, cfg.client_holdout)
        for k, part in enumerate(partition.from_client_index(device, cfg.num_clients))
    ]
    test = np.concatenate([held_out for _, held_out in splits])
    return FederatedData(
        clients=[
            ClientData(train=to_dataset(x[train], y[train]), test=to_dataset(x[held_out], y[held_out]))
            for train, held_out in splits
        ],
        test=to_dataset(x[test], y[test]),
        num_classes=_SYNTHETIC_CLASSES,
        input_shape=(_SYNTHETIC_DIMENSION,),
    )


def _pool(cfg: DataConfig, seed: int) -> Pool:
    if cfg.dataset == "npz":
        assert cfg.path is not None  # DataConfig guarantees it
        return supplied.npz_pool(cfg.path)
    if is_import_path(cfg.dataset):
        return supplied.imported_pool(cfg)
    if cfg.dataset == "synthetic":
        return builtin.synthetic_pool(cfg, seed)
    if cfg.dataset == "mnist1d":
        return builtin.mnist1d_pool(cfg.test_fraction, seed)
    return builtin.bundled_pool(cfg.dataset, cfg.test_fraction, seed)


@functools.lru_cache(maxsize=8)
def load_federated(cfg: DataConfig, seed: int) -> FederatedData:
    """Build every client's data for (cfg, seed); memoised because edges, the in-process runner and a
    process hosting many clients ask for it repeatedly. An npz file is read once per (cfg, seed): edits are
    not seen."""
    if cfg.dataset == "synthetic" and cfg.partition == "natural":
        return _synthetic_natural(cfg, seed)
    pool = _pool(cfg, seed)
    parts = _partition(cfg, pool, seed)
    empty = [k for k, part in enumerate(parts) if len(part) == 0]
    if empty:
        raise ValueError(
            f"{len(empty)} of {cfg.num_clients} clients get no training samples "
            f"(first: {empty[0]}); use fewer clients or another partition"
        )
    return FederatedData(
        clients=[_client_data(pool, part, seed, k, cfg.client_holdout) for k, part in enumerate(parts)],
        test=to_dataset(pool.x_test, pool.y_test),
        num_classes=pool.num_classes or int(max(pool.y_train.max(), pool.y_test.max())) + 1,
        input_shape=tuple(int(d) for d in pool.x_train.shape[1:]),
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
