from pathlib import Path

import numpy as np
import pytest
import torch

from shared.config import DataConfig
from shared.data import ArrayDataset, FederatedData, load_client, load_federated

BUILTIN = {"mnist5k": (5000, (1, 28, 28)), "digits": (1797, (1, 8, 8))}


def all_sets(data: FederatedData) -> list[ArrayDataset]:
    return [data.test] + [s for c in data.clients for s in (c.train, c.test)]


def rows(ds: ArrayDataset) -> set[bytes]:
    """Samples as hashable rows; the bundled datasets contain no duplicate images."""
    return {row.tobytes() for row in ds.x.reshape(len(ds), -1).numpy()}


@pytest.mark.parametrize("dataset", BUILTIN)
@pytest.mark.parametrize("part", ["iid", "dirichlet", "shards"])
def test_builtin_shapes_and_disjoint_cover(dataset: str, part: str) -> None:
    num_samples, input_shape = BUILTIN[dataset]
    cfg = DataConfig(dataset=dataset, partition=part, num_clients=7, test_fraction=0.25)
    data = load_federated(cfg, seed=3)

    assert data.num_classes == 10
    assert data.input_shape == input_shape
    assert len(data.clients) == 7
    assert len(data.test) == round(num_samples * 0.25)
    for ds in all_sets(data):
        assert ds.x.dtype == torch.float32 and ds.y.dtype == torch.int64
        assert tuple(ds.x.shape[1:]) == input_shape
        assert int(ds.y.min()) >= 0 and int(ds.y.max()) < 10
    sizes = [len(ds) for ds in all_sets(data)]
    union = set().union(*(rows(ds) for ds in all_sets(data)))
    assert sum(sizes) == num_samples == len(union), "every sample in exactly one set"


@pytest.mark.parametrize("dataset", BUILTIN)
def test_builtin_clients_hold_out_a_fifth(dataset: str) -> None:
    data = load_federated(DataConfig(dataset=dataset, num_clients=5), seed=0)
    for client in data.clients:
        total = len(client.train) + len(client.test)
        assert len(client.test) == round(0.2 * total)


@pytest.mark.parametrize("dataset", BUILTIN)
def test_builtin_is_normalised(dataset: str) -> None:
    data = load_federated(DataConfig(dataset=dataset), seed=0)
    x = torch.cat([ds.x.flatten() for ds in all_sets(data)])
    assert abs(float(x.mean())) < 0.05
    assert abs(float(x.std()) - 1.0) < 0.05


def test_load_federated_is_deterministic_per_seed() -> None:
    cfg = DataConfig(dataset="digits", partition="dirichlet", alpha=0.3, num_clients=6)
    first = load_federated(cfg, seed=11)
    load_federated.cache_clear()
    again = load_federated(cfg, seed=11)
    assert first is not again
    for a, b in zip(all_sets(first), all_sets(again)):
        assert torch.equal(a.x, b.x) and torch.equal(a.y, b.y)
    other = load_federated(cfg, seed=12)
    assert not torch.equal(first.test.y, other.test.y)


def test_load_client_returns_the_federated_client() -> None:
    cfg = DataConfig(dataset="digits", num_clients=4)
    assert load_client(cfg, 0, 2) is load_federated(cfg, 0).clients[2]
    with pytest.raises(IndexError):
        load_client(cfg, 0, 4)


def test_too_many_clients_is_an_error() -> None:
    with pytest.raises(ValueError, match="no training samples"):
        load_federated(DataConfig(dataset="digits", num_clients=2000), seed=0)


def write_npz(path: Path, **overrides: np.ndarray | None) -> str:
    """A small npz whose first feature is the sample's index, so order and membership show."""
    n_train, n_test = 40, 9
    arrays: dict[str, np.ndarray | None] = {
        "x_train": np.arange(n_train * 6, dtype=np.float64).reshape(n_train, 2, 3) / 6,
        "y_train": np.arange(n_train) % 3,
        "client_train": np.arange(n_train) % 4,
        "x_test": np.full((n_test, 2, 3), -1.0),
        "y_test": np.full(n_test, 4),
    }
    arrays.update(overrides)
    np.savez(path, **{k: v for k, v in arrays.items() if v is not None})
    return str(path)


def first_feature(ds: ArrayDataset) -> np.ndarray:
    return ds.x.reshape(len(ds), -1)[:, 0].numpy()


def test_npz_round_trip_with_file_partition(tmp_path: Path) -> None:
    path = write_npz(tmp_path / "d.npz")
    data = load_federated(DataConfig(dataset="npz", path=path, partition="file", num_clients=4), 0)

    assert data.num_classes == 5  # label 4 only appears in the test arrays
    assert data.input_shape == (2, 3)
    np.testing.assert_array_equal(data.test.y.numpy(), np.full(9, 4))
    for k, client in enumerate(data.clients):
        train, test = first_feature(client.train), first_feature(client.test)
        assert np.all(np.diff(train) > 0), "client train keeps ascending original order"
        np.testing.assert_array_equal(np.sort(np.concatenate([train, test])), np.arange(k, 40, 4))
        np.testing.assert_array_equal(client.train.y.numpy(), train.astype(np.int64) % 3)
        assert len(test) == 2


def test_npz_sampled_partition_ignores_client_train(tmp_path: Path) -> None:
    path = write_npz(tmp_path / "d.npz")
    data = load_federated(DataConfig(dataset="npz", path=path, partition="iid", num_clients=3), 0)
    seen = np.concatenate([first_feature(s) for c in data.clients for s in (c.train, c.test)])
    np.testing.assert_array_equal(np.sort(seen), np.arange(40))


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"y_train": np.zeros(39, dtype=np.int64)}, "y_train has 39 labels for 40 samples"),
        ({"client_train": np.zeros(41, dtype=np.int64)}, "client_train has 41 entries for 40"),
        ({"x_test": np.zeros((9, 3, 2))}, "x_test samples have shape"),
        ({"y_test": np.zeros(9)}, "y_test must be a 1-D integer array"),
        ({"x_train": np.zeros(40)}, "x_train must have shape"),
        ({"x_test": None}, "lacks arrays \\['x_test'\\]"),
        ({"client_train": None}, "needs a client_train array"),
        ({"client_train": np.full(40, 4)}, "client indices must lie in"),
    ],
)
def test_npz_validation_errors(
    tmp_path: Path, overrides: dict[str, np.ndarray | None], message: str
) -> None:
    path = write_npz(tmp_path / "bad.npz", **overrides)
    cfg = DataConfig(dataset="npz", path=path, partition="file", num_clients=4)
    with pytest.raises(ValueError, match=message):
        load_federated(cfg, 0)
