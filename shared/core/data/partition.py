"""Ways to split a training set over federated clients.

Every function is pure: it reads labels (or sizes) and draws randomness only from the
`numpy.random.Generator` its caller passes in, so a partition is reproducible from the run seed
and independent of any other code that happens to use random numbers. Each returns one index
array per client, sorted ascending and of dtype int64, covering every sample exactly once.
"""
from __future__ import annotations

import numpy as np

# Dirichlet draws that leave a client below `min_size` are redrawn this often before falling back
# to moving samples; small alphas with many clients can otherwise loop for a very long time.
_DIRICHLET_TRIES = 100


def _check_num_clients(num_clients: int) -> None:
    if num_clients < 1:
        raise ValueError(f"num_clients must be at least 1, got {num_clients}")


def _finish(parts: list[np.ndarray]) -> list[np.ndarray]:
    """Sorted int64 copies, so callers never see partition-internal order or dtypes."""
    return [np.sort(np.asarray(part, dtype=np.int64)) for part in parts]


def _check_int_vector(values: np.ndarray, name: str) -> np.ndarray:
    values = np.asarray(values)
    if values.ndim != 1:
        raise ValueError(f"{name} must be one-dimensional, got shape {values.shape}")
    if not np.issubdtype(values.dtype, np.integer):
        raise ValueError(f"{name} must be integers, got dtype {values.dtype}")
    return values


def iid(num_samples: int, num_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Uniformly random split into near-equal parts: the homogeneous baseline every skewed
    partition is compared against."""
    _check_num_clients(num_clients)
    if num_samples < 0:
        raise ValueError(f"num_samples must be non-negative, got {num_samples}")
    return _finish(np.array_split(rng.permutation(num_samples), num_clients))


def dirichlet(
    labels: np.ndarray,
    num_clients: int,
    alpha: float,
    rng: np.random.Generator,
    min_size: int = 1,
) -> list[np.ndarray]:
    """Label skew (Hsu et al. 2019): each class is spread over clients in Dir(alpha) proportions,
    so small alpha gives clients few classes and large alpha approaches iid."""
    labels = _check_int_vector(labels, "labels")
    _check_num_clients(num_clients)
    if alpha <= 0:
        raise ValueError(f"alpha must be positive, got {alpha}")
    if min_size < 0 or min_size * num_clients > len(labels):
        raise ValueError(
            f"cannot give {num_clients} clients at least {min_size} of {len(labels)} samples each"
        )
    class_indices = [np.flatnonzero(labels == c) for c in np.unique(labels)]
    for _ in range(_DIRICHLET_TRIES):
        parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
        for indices in class_indices:
            shuffled = rng.permutation(indices)
            proportions = rng.dirichlet(np.full(num_clients, alpha))
            cuts = (np.cumsum(proportions)[:-1] * len(shuffled)).astype(np.int64)
            for client, chunk in enumerate(np.split(shuffled, cuts)):
                parts[client].append(chunk)
        merged = [np.concatenate(p) if p else np.empty(0, np.int64) for p in parts]
        if min(len(p) for p in merged) >= min_size:
            return _finish(merged)
    return _finish(_top_up(merged, min_size, rng))


def _top_up(parts: list[np.ndarray], min_size: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Move random samples from the largest client to the smallest until all reach `min_size`.

    Terminates because the caller checked min_size * num_clients <= total, so whenever a client is
    short the largest one holds more than min_size.
    """
    parts = list(parts)
    sizes = np.array([len(p) for p in parts])
    while sizes.min() < min_size:
        short, donor = int(sizes.argmin()), int(sizes.argmax())
        count = min(min_size - sizes[short], sizes[donor] - min_size)
        moved = rng.choice(sizes[donor], size=count, replace=False)
        keep = np.ones(sizes[donor], dtype=bool)
        keep[moved] = False
        parts[short] = np.concatenate([parts[short], parts[donor][moved]])
        parts[donor] = parts[donor][keep]
        sizes[short] += count
        sizes[donor] -= count
    return parts


def shards(
    labels: np.ndarray, num_clients: int, shards_per_client: int, rng: np.random.Generator
) -> list[np.ndarray]:
    """Pathological non-iid split of McMahan et al. 2017: sorted-by-label shards dealt at random,
    so each client sees only about `shards_per_client` classes."""
    labels = _check_int_vector(labels, "labels")
    _check_num_clients(num_clients)
    if shards_per_client < 1:
        raise ValueError(f"shards_per_client must be at least 1, got {shards_per_client}")
    num_shards = num_clients * shards_per_client
    if num_shards > len(labels):
        raise ValueError(f"cannot cut {len(labels)} samples into {num_shards} non-empty shards")
    # Sizes differ by at most one when the shard count does not divide the sample count.
    cut = np.array_split(np.argsort(labels, kind="stable"), num_shards)
    dealt = rng.permutation(num_shards).reshape(num_clients, shards_per_client)
    return _finish([np.concatenate([cut[s] for s in row]) for row in dealt])


def from_client_index(client_index: np.ndarray, num_clients: int) -> list[np.ndarray]:
    """A partition stored with the data (e.g. one writer per client in FEMNIST), for natural
    non-iid splits no sampler can reproduce."""
    client_index = _check_int_vector(client_index, "client_index")
    _check_num_clients(num_clients)
    if len(client_index) and (client_index.min() < 0 or client_index.max() >= num_clients):
        raise ValueError(
            f"client indices must lie in [0, {num_clients}), "
            f"got range [{client_index.min()}, {client_index.max()}]"
        )
    counts = np.bincount(client_index, minlength=num_clients)
    order = np.argsort(client_index, kind="stable")
    return _finish(np.split(order, np.cumsum(counts)[:-1]))


def few_shot_classes(
    labels: np.ndarray,
    num_clients: int,
    rng: np.random.Generator,
    ways: tuple[int, int] = (2, 5),
    max_shots: int = 50,
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """FedProto's MNIST split (Tan et al., AAAI 2022; lib/sampling.py), scaled to a small pool: client i
    draws n_i classes uniformly from ways[0]..ways[1] (n_i itself uniform), then each class c is dealt in
    disjoint chunks of min(max_shots, pool_c // clients holding c) samples to the clients that hold it.

    Unlike the partitions above it does not cover the pool: samples beyond every holder's chunk are left
    out, as FedProto leaves most of MNIST out. Returns each client's sample indices (sorted, int64) and
    its classes (sorted)."""
    labels = _check_int_vector(labels, "labels")
    _check_num_clients(num_clients)
    low, high = ways
    classes_in_pool = np.unique(labels)
    if not 1 <= low <= high <= len(classes_in_pool):
        raise ValueError(f"ways {ways} must lie within 1..{len(classes_in_pool)} (the classes present)")
    if max_shots < 1:
        raise ValueError(f"max_shots must be at least 1, got {max_shots}")
    ways_of = rng.integers(low, high + 1, size=num_clients)
    classes = [np.sort(rng.choice(classes_in_pool, size=n, replace=False)) for n in ways_of]
    parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    for c in classes_in_pool:
        holders = [k for k in range(num_clients) if c in classes[k]]
        if not holders:
            continue
        pool = rng.permutation(np.flatnonzero(labels == c))
        shots = min(max_shots, len(pool) // len(holders))
        if shots < 1:
            raise ValueError(f"class {c} has {len(pool)} samples for {len(holders)} clients")
        for n, k in enumerate(holders):
            parts[k].append(pool[n * shots : (n + 1) * shots])
    return _finish([np.concatenate(p) for p in parts]), [c.astype(np.int64) for c in classes]
