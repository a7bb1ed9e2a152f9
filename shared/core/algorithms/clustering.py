"""Client clustering for ClusterFedVARP's default client→cluster map.

Plain Lloyd's k-means with k-means++ seeding, in numpy, drawing only from the Generator it is given,
so the map is a deterministic function of (data config, run seed, k). The points are the clients'
label histograms (each client's share of every class in its training split), which groups clients
whose data look alike: exactly the clients whose updates a shared memory slot can stand in for.
"""
from __future__ import annotations

import numpy as np

from fl_services.shared.core.config import DataConfig
from fl_services.shared.core.data import FederatedData, load_federated
from fl_services.shared.core.seeding import numpy_generator

# Stream tag for the clustering draws; far from shared.core.seeding's small tags so it never shares a stream.
CLUSTERING = 0x434C5553  # "CLUS"
_MAX_ITER = 300


def _sq_distances(points: np.ndarray, centres: np.ndarray) -> np.ndarray:
    # Direct differences rather than ‖x‖² − 2x·c + ‖c‖²: no cancellation, so ties stay exact ties.
    return ((points[:, None, :] - centres[None, :, :]) ** 2).sum(-1)


def kmeans_plus_plus(points: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """k initial centres (Arthur & Vassilvitskii, 2007): the first uniform, each next one drawn with
    probability ∝ squared distance to the nearest centre chosen so far (uniform if all are covered)."""
    n = len(points)
    chosen = [int(rng.integers(n))]
    nearest = _sq_distances(points, points[chosen])[:, 0]
    for _ in range(1, k):
        total = nearest.sum()
        probs = nearest / total if total > 0 else np.full(n, 1.0 / n)
        chosen.append(int(rng.choice(n, p=probs)))
        nearest = np.minimum(nearest, _sq_distances(points, points[chosen[-1:]])[:, 0])
    return points[chosen].copy()


def canonical_labels(labels: np.ndarray) -> np.ndarray:
    """Renumbers clusters by first appearance (point 0's cluster is 0, ...), dropping empty ones, so
    equal partitions of the points always get equal labels."""
    order: dict[int, int] = {}
    for label in labels.tolist():
        order.setdefault(label, len(order))
    return np.array([order[label] for label in labels.tolist()], dtype=np.int64)


def kmeans(points: np.ndarray, k: int, rng: np.random.Generator, max_iter: int = _MAX_ITER) -> np.ndarray:
    """Cluster labels of `points` (n, d) under Lloyd's algorithm from a k-means++ start.

    k is capped at n. A cluster that loses all its points keeps its centre. Labels are canonical (see
    `canonical_labels`), so there may be fewer than k distinct labels when points coincide.
    """
    points = np.asarray(points, dtype=np.float64)
    if points.ndim != 2 or len(points) == 0:
        raise ValueError(f"need a non-empty (n, d) array of points, got shape {points.shape}")
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    k = min(k, len(points))
    centres = kmeans_plus_plus(points, k, rng)
    labels = _sq_distances(points, centres).argmin(1)
    for _ in range(max_iter):
        for j in range(k):
            members = points[labels == j]
            if len(members):
                centres[j] = members.mean(0)
        new = _sq_distances(points, centres).argmin(1)
        if np.array_equal(new, labels):
            break
        labels = new
    return canonical_labels(labels)


def label_histograms(data: FederatedData) -> np.ndarray:
    """(N, classes): each client's share of every class in its training split."""
    counts = np.stack([
        np.bincount(c.train.y.numpy(), minlength=data.num_classes).astype(np.float64) for c in data.clients
    ])
    return counts / counts.sum(1, keepdims=True)


def label_histogram_clusters(data_config: DataConfig, seed: int, num_clusters: int) -> list[int]:
    """The default client→cluster map: k-means on label histograms, seeded from the run seed."""
    points = label_histograms(load_federated(data_config, seed))
    return kmeans(points, num_clusters, numpy_generator(seed, CLUSTERING)).tolist()
