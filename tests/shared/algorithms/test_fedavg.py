"""FedAvg against numbers derived by hand, plus the equivalences the issue promises."""
from functools import partial

import pytest
import torch

from fl_services.shared.core.algorithms.base import MODEL, ClientResult, Contribution, LocalJob
from fl_services.shared.core.algorithms.fedavg import FedAvg
from fl_services.shared.core.config import ModelConfig, RunConfig
from fl_services.shared.core.data import ArrayDataset, ClientData
from fl_services.shared.core.models import build_model
from fl_services.shared.core.reference import run_reference
from fl_services.shared.core.tensors import MAX_ABS, InvalidContent

SMALL = dict(model={"name": "logreg"}, data={"dataset": "digits", "num_clients": 6}, local={"lr": 0.1})


def test_local_update_one_full_batch_step_by_hand():
    # Zero logreg, 2 classes: softmax is [.5, .5], so dL/dW = mean((p - e_y) x^T) = [[-.25, .25], [.25, -.25]]
    # and dL/db = mean(p - e_y) = 0. One step at lr 0.1 gives Δw = -0.1 * grad.
    config = RunConfig(**{**SMALL, "local": {"epochs": 1, "batch_size": 0, "lr": 0.1}})
    data = ArrayDataset(torch.tensor([[1.0, 0.0], [0.0, 1.0]]), torch.tensor([0, 1]))
    job = LocalJob(0, 0, ClientData(data, data), partial(build_model, ModelConfig(name="logreg"), (2,), 2),
                   torch.Generator().manual_seed(0))
    task = {MODEL: {"linear.weight": torch.zeros(2, 2), "linear.bias": torch.zeros(2)}}
    update = FedAvg(config).local_update(job, task, {})
    assert update.num_samples == 2
    assert torch.allclose(update.tensors[MODEL]["linear.weight"], torch.tensor([[0.025, -0.025], [-0.025, 0.025]]))
    assert torch.allclose(update.tensors[MODEL]["linear.bias"], torch.zeros(2))
    assert update.loss == pytest.approx(torch.log(torch.tensor(2.0)).item())


@pytest.mark.parametrize("weighting, sums, weight", [("samples", [2.0, 6.0], 8.0), ("uniform", [1.0, 1.0], 2.0)])
def test_edge_aggregate_weights(weighting, sums, weight):
    algo = FedAvg(RunConfig(**SMALL, weighting=weighting))
    results = [ClientResult(5, 6, 0.0, {MODEL: {"w": torch.tensor([0.0, 1.0])}}),
               ClientResult(1, 2, 0.0, {MODEL: {"w": torch.tensor([1.0, 0.0])}})]
    aggregate, _ = algo.edge_aggregate(results, {}, 0)
    assert aggregate.weight == weight
    assert torch.equal(aggregate.tensors[MODEL]["w"], torch.tensor(sums, dtype=torch.float64))


@pytest.mark.parametrize("server_lr, expected", [(1.0, [1.25, 1.75]), (2.0, [1.5, 2.5])])
def test_cloud_update_by_hand(server_lr, expected):
    # p = [2/8, 6/8]; w + η_s (2/8·[1,0] + 6/8·[0,1]) = [1,1] + η_s [.25, .75]
    algo = FedAvg(RunConfig(**SMALL, server_lr=server_lr))
    contributions = [Contribution(0, 0, {MODEL: {"w": torch.tensor([2.0, 0.0], dtype=torch.float64)}}, 2.0),
                     Contribution(1, 0, {MODEL: {"w": torch.tensor([0.0, 6.0], dtype=torch.float64)}}, 6.0)]
    new, _ = algo.cloud_update({MODEL: {"w": torch.ones(2)}}, contributions, {}, 0)
    assert torch.allclose(new[MODEL]["w"], torch.tensor(expected))


def test_reference_is_deterministic_given_the_seed():
    config = RunConfig(**SMALL, rounds=2, fraction=0.5)
    a, b = run_reference(config), run_reference(config)
    c = run_reference(config.model_copy(update={"seed": 1}))
    for name in a.global_state:
        assert torch.equal(a.global_state[name], b.global_state[name])
    assert any(not torch.equal(a.global_state[n], c.global_state[n]) for n in a.global_state)
    assert [[c.client_id for c in h.clients] for h in a.history] ==\
        [[c.client_id for c in h.clients] for h in b.history]
    assert all(len(h.clients) == 3 for h in a.history)


def test_two_edges_equal_one_edge_when_everyone_participates():
    """Edges send associative partials, so splitting clients over edges leaves FedAvg unchanged."""
    flat = run_reference(RunConfig(**SMALL, rounds=2))
    hier = run_reference(RunConfig(**SMALL, rounds=2, topology={"num_edges": 2, "buffer_size": 2}))
    for name in flat.global_state:
        assert torch.allclose(flat.global_state[name], hier.global_state[name], atol=1e-6)


def test_hierarchical_edge_rounds_by_hand():
    """κ = 2: edge model after round 1 is w + mean Δ; the submission is W·(w_l − w) + Σ p̃ Δ of round 2."""
    algo = FedAvg(RunConfig(**SMALL, topology={"num_edges": 2, "buffer_size": 2, "edge_rounds": 2}))
    w = {MODEL: {"w": torch.tensor([1.0, 1.0])}}
    first = algo.edge_aggregate([ClientResult(0, 1, 0.0, {MODEL: {"w": torch.tensor([1.0, 0.0])}}),
                                 ClientResult(2, 3, 0.0, {MODEL: {"w": torch.tensor([0.0, 1.0])}})], {}, 0)[0]
    edge_model = algo.edge_round_update(w, first)  # [1 + 1/4, 1 + 3/4]
    assert torch.allclose(edge_model[MODEL]["w"], torch.tensor([1.25, 1.75]))
    second = algo.edge_aggregate([ClientResult(0, 1, 0.0, {MODEL: {"w": torch.tensor([0.5, 0.5])}}),
                                  ClientResult(2, 3, 0.0, {MODEL: {"w": torch.tensor([0.5, 0.5])}})], {}, 1)[0]
    submitted = algo.edge_contribution(w, edge_model, second)  # weight 4; 4·[.25, .75] + 4·[.5, .5]
    assert submitted.weight == 4.0
    assert torch.allclose(submitted.tensors[MODEL]["w"], torch.tensor([3.0, 5.0], dtype=torch.float64))


def test_hierarchical_reference_runs_and_learns():
    config = RunConfig(**SMALL, rounds=3, topology={"num_edges": 2, "buffer_size": 2, "edge_rounds": 2})
    result = run_reference(config)
    assert result.history[-1].test_accuracy > 0.8
    assert all(len(h.clients) == 12 for h in result.history)  # 6 clients × 2 edge rounds


def test_results_and_contributions_beyond_the_magnitude_bound_refused():
    """Finite but absurd values pass the NaN check and would overflow float32 in the global model."""
    a = FedAvg(RunConfig(**SMALL))
    task = {MODEL: {"linear.weight": torch.zeros(2, 2), "linear.bias": torch.zeros(2)}}
    a.check_result(task, {MODEL: {"linear.weight": torch.full((2, 2), MAX_ABS), "linear.bias": torch.zeros(2)}})
    with pytest.raises(InvalidContent, match="'model/linear.weight' has values beyond"):
        a.check_result(task, {MODEL: {"linear.weight": torch.full((2, 2), 1e30), "linear.bias": torch.zeros(2)}})
    # A contribution carries Σ w_k Δ_k (float32 on the wire): its bound is on the mean, sums / weight.
    sums = {MODEL: {"linear.weight": torch.full((2, 2), 3 * MAX_ABS), "linear.bias": torch.zeros(2)}}
    a.check_contribution(task, [0, 1, 2], sums, weight=3.0)
    with pytest.raises(InvalidContent, match="values beyond"):
        a.check_contribution(task, [0, 1, 2], sums, weight=2.0)
