from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fl_services.shared.core.data import partition

NUM_CLASSES, PER_CLASS, NUM_CLIENTS = 10, 100, 10
Partitioner = Callable[[np.random.Generator], list[np.ndarray]]


def rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


def shuffled_labels() -> np.ndarray:
    """Balanced labels in random order, so partitioners cannot rely on the input being sorted."""
    return rng(123).permutation(np.repeat(np.arange(NUM_CLASSES), PER_CLASS))


def assert_exact_cover(parts: list[np.ndarray], num_samples: int) -> None:
    for part in parts:
        assert part.dtype == np.int64
        assert np.all(np.diff(part) > 0), "indices must be sorted ascending and unique"
    joined = np.concatenate(parts) if parts else np.empty(0, np.int64)
    np.testing.assert_array_equal(np.sort(joined), np.arange(num_samples))


def distinct_labels(parts: list[np.ndarray], labels: np.ndarray) -> list[int]:
    return [len(np.unique(labels[part])) for part in parts]


LABELS = shuffled_labels()
PARTITIONERS: dict[str, Partitioner] = {
    "iid": lambda g: partition.iid(len(LABELS), NUM_CLIENTS, g),
    "dirichlet": lambda g: partition.dirichlet(LABELS, NUM_CLIENTS, 0.5, g),
    "shards": lambda g: partition.shards(LABELS, NUM_CLIENTS, 2, g),
}


@pytest.mark.parametrize("name", PARTITIONERS)
def test_partitioner_covers_every_index_once(name: str) -> None:
    parts = PARTITIONERS[name](rng(0))
    assert len(parts) == NUM_CLIENTS
    assert_exact_cover(parts, len(LABELS))


@pytest.mark.parametrize("name", PARTITIONERS)
def test_partitioner_is_a_function_of_the_generator_seed(name: str) -> None:
    same_a, same_b, other = (PARTITIONERS[name](rng(s)) for s in (7, 7, 8))
    assert all(np.array_equal(a, b) for a, b in zip(same_a, same_b, strict=True))
    assert not all(np.array_equal(a, b) for a, b in zip(same_a, other, strict=True))


def test_partitioners_leave_global_rng_alone() -> None:
    np.random.seed(0)
    expected = np.random.random()
    np.random.seed(0)
    for make in PARTITIONERS.values():
        make(rng(1))
    assert np.random.random() == expected


def test_iid_sizes_differ_by_at_most_one() -> None:
    sizes = [len(p) for p in partition.iid(103, 10, rng(0))]
    assert max(sizes) - min(sizes) <= 1


def test_small_alpha_dirichlet_is_label_skewed() -> None:
    iid_parts = partition.iid(len(LABELS), NUM_CLIENTS, rng(0))
    skewed_parts = partition.dirichlet(LABELS, NUM_CLIENTS, 0.1, rng(0))
    assert np.mean(distinct_labels(iid_parts, LABELS)) == NUM_CLASSES
    assert np.mean(distinct_labels(skewed_parts, LABELS)) < 0.7 * NUM_CLASSES


def test_dirichlet_falls_back_to_min_size(monkeypatch: pytest.MonkeyPatch) -> None:
    # One try with a tiny alpha over 50 clients leaves some clients short, forcing the fallback.
    monkeypatch.setattr(partition, "_DIRICHLET_TRIES", 1)
    parts = partition.dirichlet(LABELS, 50, 0.01, rng(0), min_size=15)
    assert_exact_cover(parts, len(LABELS))
    assert min(len(p) for p in parts) >= 15


def test_dirichlet_rejects_impossible_min_size() -> None:
    with pytest.raises(ValueError, match="at least 101"):
        partition.dirichlet(LABELS, NUM_CLIENTS, 0.5, rng(0), min_size=101)


def test_shards_give_each_client_at_most_its_shard_count_of_labels() -> None:
    parts = partition.shards(LABELS, NUM_CLIENTS, 2, rng(0))
    assert max(distinct_labels(parts, LABELS)) <= 2
    assert {len(p) for p in parts} == {len(LABELS) // NUM_CLIENTS}


def test_shards_need_enough_samples() -> None:
    with pytest.raises(ValueError, match="non-empty shards"):
        partition.shards(np.arange(5), 3, 2, rng(0))


def test_from_client_index_groups_samples_by_client() -> None:
    client_index = np.array([2, 0, 2, 2, 0, 3])
    parts = partition.from_client_index(client_index, 5)
    expected = [[1, 4], [], [0, 2, 3], [5], []]
    assert [p.tolist() for p in parts] == expected
    assert all(p.dtype == np.int64 for p in parts)


@pytest.mark.parametrize("bad", [np.array([0, 5]), np.array([-1, 0]), np.array([0.0, 1.0])])
def test_from_client_index_rejects_bad_indices(bad: np.ndarray) -> None:
    with pytest.raises(ValueError, match="client"):
        partition.from_client_index(bad, 5)


@settings(max_examples=60, deadline=None)
@given(
    num_samples=st.integers(0, 400),
    num_clients=st.integers(1, 40),
    seed=st.integers(0, 2**32 - 1),
)
def test_iid_property_exact_cover(num_samples: int, num_clients: int, seed: int) -> None:
    parts = partition.iid(num_samples, num_clients, rng(seed))
    assert len(parts) == num_clients
    assert_exact_cover(parts, num_samples)


@st.composite
def dirichlet_cases(draw: st.DrawFn) -> tuple[np.ndarray, int, float, int]:
    labels = np.array(draw(st.lists(st.integers(0, 9), min_size=1, max_size=300)), dtype=np.int64)
    num_clients = draw(st.integers(1, min(len(labels), 30)))
    min_size = draw(st.integers(0, len(labels) // num_clients))
    alpha = draw(st.floats(0.01, 10.0))
    return labels, num_clients, alpha, min_size


@settings(max_examples=60, deadline=None)
@given(case=dirichlet_cases(), seed=st.integers(0, 2**32 - 1))
def test_dirichlet_property_exact_cover(
    case: tuple[np.ndarray, int, float, int], seed: int
) -> None:
    labels, num_clients, alpha, min_size = case
    parts = partition.dirichlet(labels, num_clients, alpha, rng(seed), min_size=min_size)
    assert len(parts) == num_clients
    assert_exact_cover(parts, len(labels))
    assert min(len(p) for p in parts) >= min_size


@pytest.mark.parametrize("seed", range(5))
def test_few_shot_classes_deals_disjoint_chunks_of_each_clients_classes(seed):
    labels = shuffled_labels()  # 100 per class
    parts, classes = partition.few_shot_classes(labels, 20, rng(seed), ways=(2, 5), max_shots=8)
    assert all(2 <= len(c) <= 5 for c in classes)
    joined = np.concatenate(parts)
    assert len(np.unique(joined)) == len(joined)  # disjoint
    holders = np.bincount(np.concatenate(classes), minlength=NUM_CLASSES)
    for part, mine in zip(parts, classes, strict=True):
        assert part.dtype == np.int64 and np.all(np.diff(part) > 0)
        np.testing.assert_array_equal(np.unique(labels[part]), mine)
        for c in mine:  # min(max_shots, pool_c // clients holding c)
            assert (labels[part] == c).sum() == min(8, PER_CLASS // holders[c])
    few = partition.few_shot_classes(labels, 20, rng(seed), ways=(2, 5), max_shots=1000)[0]
    assert max(len(p) for p in few) > max(len(p) for p in parts)  # the pool's share binds, not the cap


def test_few_shot_classes_refuses_impossible_ways():
    with pytest.raises(ValueError, match="ways"):
        partition.few_shot_classes(shuffled_labels(), 3, rng(0), ways=(2, 11))
