"""ClusterFedVARP against numbers derived by hand; the default cluster map (k-means on label histograms)."""
import numpy as np
import pytest
import torch

from fl_services.shared.core.algorithms import registry
from fl_services.shared.core.algorithms.base import MODEL, ClientResult, Contribution
from fl_services.shared.core.algorithms.clusterfedvarp import ClusterFedVARP
from fl_services.shared.core.algorithms.clustering import canonical_labels, kmeans, label_histograms
from fl_services.shared.core.algorithms.fedvarp import DELTAS, MEMORY, FedVARP
from fl_services.shared.core.config import RunConfig
from fl_services.shared.core.data import load_federated
from fl_services.shared.core.federation import participation
from fl_services.shared.core.records import check, decode_state, encode
from fl_services.shared.core.reference import run_reference
from tests.shared.algorithms.determinism import assert_reference_is_deterministic

SMALL = {"algorithm": "clusterfedvarp", "model": {"name": "logreg"}, "data": {"dataset": "digits", "num_clients": 6},
         "local": {"lr": 0.1}}




def algo(clusters: list[int] | None, num_clients: int = 4, server_lr: float = 1.0, **params) -> ClusterFedVARP:
    return ClusterFedVARP(RunConfig(**{**SMALL, "data": {"dataset": "digits", "num_clients": num_clients}},
                                    params={"clusters": clusters, **params}, server_lr=server_lr))


def contribution(algorithm, deltas: dict[int, float]) -> Contribution:
    results = [ClientResult(k, 10 * (k + 1), 0.0, {MODEL: {"w": torch.tensor([d])}}) for k, d in deltas.items()]
    agg, _ = algorithm.edge_aggregate(results, {}, 0)
    return Contribution(0, 0, agg.tensors, agg.weight, tuple(participation(results)))


def test_cloud_update_by_hand_with_a_given_map():
    # N = 4, c = [0, 0, 1, 2] (sizes 2, 1, 1), y = [1, 2, 4]; S = {0, 1, 3}, Δw = 3, 5, 7; w = 10, η_s = 1.
    # Σ_j y_{c_j} = 1 + 1 + 2 + 4 = 8 → 8/4 = 2; (1/3)[(3 − 1) + (5 − 1) + (7 − 4)] = 9/3 = 3; v = 5, w = 15.
    # y_0 ← mean(3, 5) = 4; cluster 1 had nobody in S: y_1 = 2 stays; y_2 ← 7.
    a = algo([0, 0, 1, 2])
    state = {MEMORY: {"w": torch.tensor([[1.0], [2.0], [4.0]], dtype=torch.float64)}}
    buffer = [contribution(a, {3: 7.0, 0: 3.0, 1: 5.0})]
    new, new_state = a.cloud_update({MODEL: {"w": torch.tensor([10.0])}}, buffer, state, 2)
    assert torch.equal(new[MODEL]["w"], torch.tensor([15.0]))
    assert torch.equal(new_state[MEMORY]["w"], torch.tensor([[4.0], [2.0], [7.0]], dtype=torch.float64))
    assert torch.equal(state[MEMORY]["w"], torch.tensor([[1.0], [2.0], [4.0]], dtype=torch.float64))


def test_two_rounds_from_empty_memory_by_hand_with_an_unused_cluster_id():
    # c = [2, 0, 2, 0]: id 1 is nobody's, G = 3. Round 0, y = 0: S = {0, 1}, Δw = 2, 6: v = 4, w = 4;
    # y_2 ← 2, y_0 ← 6.  Round 1: S = {2, 3}, Δw = 1, 3, η_s = 0.5:
    # (1/2)[(1 − y_2) + (3 − y_0)] = ½[(1 − 2) + (3 − 6)] = −2; (1/4)(y_2 + y_0 + y_2 + y_0) = 16/4 = 4;
    # v = 2, w = 4 + 0.5·2 = 5; y_2 ← 1, y_0 ← 3, y_1 stays 0.
    a = algo([2, 0, 2, 0], server_lr=1.0)
    w, state = a.cloud_update({MODEL: {"w": torch.tensor([0.0])}}, [contribution(a, {0: 2.0, 1: 6.0})], {}, 0)
    assert torch.equal(w[MODEL]["w"], torch.tensor([4.0]))
    assert torch.equal(state[MEMORY]["w"], torch.tensor([[6.0], [0.0], [2.0]], dtype=torch.float64))
    b = algo([2, 0, 2, 0], server_lr=0.5)
    w, state = b.cloud_update(w, [contribution(b, {2: 1.0, 3: 3.0})], state, 1)
    assert torch.equal(w[MODEL]["w"], torch.tensor([5.0]))
    assert torch.equal(state[MEMORY]["w"], torch.tensor([[3.0], [0.0], [1.0]], dtype=torch.float64))


def test_singleton_clusters_are_fedvarp():
    g = torch.Generator().manual_seed(1)
    memory = torch.randn(4, 3, generator=g)
    deltas = {k: torch.randn(3, generator=g) for k in (0, 2)}
    global_ = {MODEL: {"w": torch.randn(3, generator=g)}}
    outcomes = []
    for a in (algo([0, 1, 2, 3]), FedVARP(RunConfig(**{**SMALL, "algorithm": "fedvarp",
                                                       "data": {"dataset": "digits", "num_clients": 4}}))):
        results = [ClientResult(k, 1, 0.0, {MODEL: {"w": d}}) for k, d in deltas.items()]
        agg, _ = a.edge_aggregate(results, {}, 0)
        contribution = Contribution(0, 0, agg.tensors, agg.weight, tuple(participation(results)))
        outcomes.append(a.cloud_update(global_, [contribution],
                                       {MEMORY: {"w": memory.to(a.memory_dtype(global_[MODEL]["w"]))}}, 0))
    (w_c, y_c), (w_f, y_f) = outcomes
    assert torch.equal(w_c[MODEL]["w"], w_f[MODEL]["w"])
    assert torch.equal(y_c[MEMORY]["w"].float(), y_f[MEMORY]["w"])


def test_contribution_spec_and_state_round_trip():
    a = algo([0, 1, 0, 1])
    global_ = {MODEL: {"w": torch.zeros(2, 3), "b": torch.zeros(3)}}
    assert a.contribution_spec(global_, [2]) == {
        DELTAS: {"w": ((1, 2, 3), torch.float32), "b": ((1, 3), torch.float32)}}
    results = [ClientResult(2, 5, 0.1, {MODEL: {"w": torch.ones(2, 3), "b": torch.ones(3)}})]
    agg, _ = a.edge_aggregate(results, {}, 0)
    check(decode_state(encode(agg.tensors)), a.contribution_spec(global_, [2]))
    contribution = Contribution(0, 0, agg.tensors, agg.weight, tuple(participation(results)))
    _, state = a.cloud_update(global_, [contribution], {}, 0)
    assert {k: (tuple(v.shape), v.dtype) for k, v in state[MEMORY].items()} == {
        "w": ((2, 2, 3), torch.float64), "b": ((2, 3), torch.float64)}
    assert torch.equal(decode_state(encode(state))[MEMORY]["w"], state[MEMORY]["w"])


def test_config_checks():
    with pytest.raises(ValueError, match="clusterfedvarp keeps global server memory and runs with one edge only"):
        registry.check(RunConfig(**SMALL, topology={"num_edges": 2, "buffer_size": 2}))
    with pytest.raises(ValueError, match="maps 3 clients"):
        registry.check(RunConfig(**SMALL, params={"clusters": [0, 1, 0]}))
    with pytest.raises(ValueError, match=r"ids in \[0, 6\)"):
        registry.check(RunConfig(**SMALL, params={"clusters": [0, 1, 0, 1, 0, 6]}))
    with pytest.raises(ValueError):
        registry.check(RunConfig(**SMALL, params={"num_clusters": 0}))
    with pytest.raises(ValueError):
        registry.check(RunConfig(**SMALL, params={"k": 3}))


# ---- the default map ---------------------------------------------------------------------------
def test_kmeans_finds_well_separated_groups_whatever_the_seed():
    points = np.array([[0.0, 0.0], [0.1, 0.0], [5.0, 5.0], [0.0, 0.1], [5.1, 5.0], [9.0, 0.0]])
    for seed in range(5):
        assert kmeans(points, 3, np.random.default_rng(seed)).tolist() == [0, 0, 1, 0, 1, 2]


def test_kmeans_with_more_clusters_than_distinct_points():
    points = np.array([[1.0], [1.0], [2.0], [2.0]])
    assert kmeans(points, 4, np.random.default_rng(0)).tolist() == [0, 0, 1, 1]
    assert kmeans(points[:1], 3, np.random.default_rng(0)).tolist() == [0]


def test_canonical_labels_number_by_first_appearance():
    assert canonical_labels(np.array([3, 3, 1, 7, 1])).tolist() == [0, 0, 1, 2, 1]


def test_label_histograms_are_class_shares():
    data = load_federated(RunConfig(**SMALL).data, 0)
    h = label_histograms(data)
    assert h.shape == (6, 10)
    k = 4
    expected = torch.bincount(data.clients[k].train.y, minlength=10).double() / len(data.clients[k].train)
    assert np.allclose(h[k], expected.numpy())


def test_default_map_is_cached_deterministic_and_groups_similar_clients():
    # Shards of one class each: with 2 clusters on 10 clients the k-means map must put together
    # clients whose label sets overlap more than across clusters.
    config = RunConfig(**{**SMALL, "data": {"dataset": "digits", "num_clients": 10, "partition": "shards",
                                            "shards_per_client": 1}}, params={"num_clusters": 3})
    a, b = ClusterFedVARP(config), ClusterFedVARP(config)
    groups = a.memory_groups()
    assert groups is a.memory_groups()
    assert groups == b.memory_groups()
    assert len(groups) == 10 and set(groups) == {0, 1, 2} and groups[0] == 0
    h = label_histograms(load_federated(config.data, config.seed))
    centres = np.stack([h[np.array(groups) == g].mean(0) for g in range(3)])
    nearest = ((h[:, None, :] - centres[None]) ** 2).sum(-1).argmin(1)
    assert nearest.tolist() == groups  # a fixed point of Lloyd's iteration


def test_reference_is_deterministic_with_partial_participation_and_two_epochs():
    config = RunConfig(**{**SMALL, "local": {"lr": 0.1, "epochs": 2}}, rounds=3, fraction=0.5)
    assert_reference_is_deterministic(config, participants=3, min_accuracy=0.8)


def test_explicit_map_changes_the_run():
    config = RunConfig(**{**SMALL, "local": {"lr": 0.1, "epochs": 2}}, rounds=3, fraction=0.5)
    default = run_reference(config)
    explicit = run_reference(config.model_copy(update={"params": {"clusters": [0, 0, 0, 0, 0, 0]}}))
    assert any(not torch.allclose(default.global_state[n], explicit.global_state[n], atol=1e-5)
               for n in default.global_state)
