"""pFedMe against numbers derived by hand, plus the reference runner's plumbing for it."""
import math
from functools import partial

import pytest
import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from fl_services.shared.core.algorithms import registry
from fl_services.shared.core.algorithms.base import MODEL, ClientResult, Contribution, LocalJob
from fl_services.shared.core.algorithms.pfedme import PERSONAL, PFedMe, personal_metrics
from fl_services.shared.core.config import ModelConfig, RunConfig
from fl_services.shared.core.data import ArrayDataset, ClientData, load_federated
from fl_services.shared.core.federation import initial_model, local_job
from fl_services.shared.core.models import build_model
from fl_services.shared.core.reference import run_reference
from fl_services.shared.core.selection import select_clients

SMALL = dict(model={"name": "logreg"}, data={"dataset": "digits", "num_clients": 6}, local={"lr": 0.1},
             algorithm="pfedme")
# The two-point problem of test_fedavg: x = e_0 with label 0 and x = e_1 with label 1, zero logreg.
POINTS = ArrayDataset(torch.tensor([[1.0, 0.0], [0.0, 1.0]]), torch.tensor([0, 1]))
U = torch.tensor([[1.0, -1.0], [-1.0, 1.0]])


def sigmoid(z: float) -> float:
    return 1.0 / (1.0 + math.exp(-z))


def ce_grad_coefficient(c: float) -> float:
    """At W = c·U, b = 0: logits are ±(c, −c), p_true = σ(2c), so dL/dW = −(1 − σ(2c))/2 · U and dL/db = 0."""
    return -(1.0 - sigmoid(2 * c)) / 2


def two_point_job(config: RunConfig) -> tuple[PFedMe, LocalJob, dict]:
    job = LocalJob(0, 0, ClientData(POINTS, POINTS), partial(build_model, ModelConfig(name="logreg"), (2,), 2),
                   torch.Generator().manual_seed(0))
    task = {MODEL: {"linear.weight": torch.zeros(2, 2), "linear.bias": torch.zeros(2)}}
    return PFedMe(config), job, task


def config_with(params: dict, **local) -> RunConfig:
    return RunConfig(**{**SMALL, "params": params, "local": {"batch_size": 0, **local}})


def test_one_local_round_two_inner_steps_by_hand():
    # R = 1, K = 2, η_p = 0.4, λ = 2, η = 0.25, full batch; θ = ω = 0.
    # Step 1: ∇ℓ(0) = −¼U (coefficient at c = 0), prox term 0: θ = 0.4·¼U = 0.1U.
    # Step 2: ∇ℓ(0.1U) = −(1 − σ(0.2))/2 U, prox λ(θ − ω) = 2·0.1U:
    #         θ = (0.1 + 0.4·σ(−0.2)/2 − 0.4·0.2)U = (0.02 + 0.2σ(−0.2))U = 0.1100332U.
    # ω ← ω − ηλ(ω − θ) = 0.25·2·θ = 0.0550166U; biases stay 0 (their gradients cancel over the two points).
    algo, job, task = two_point_job(config_with(
        {"local_rounds": 1, "inner_steps": 2, "personal_lr": 0.4, "lam": 2.0}, lr=0.25))
    update = algo.local_update(job, task, {})
    theta = 0.02 + 0.2 * sigmoid(-0.2)
    assert theta == pytest.approx(0.1100332, abs=1e-7)
    assert torch.allclose(update.state[PERSONAL]["linear.weight"], theta * U, atol=1e-7)
    assert torch.allclose(update.tensors[MODEL]["linear.weight"], 0.5 * theta * U, atol=1e-7)
    assert torch.allclose(update.tensors[MODEL]["linear.bias"], torch.zeros(2), atol=1e-7)
    assert torch.allclose(update.state[PERSONAL]["linear.bias"], torch.zeros(2), atol=1e-7)
    assert update.num_samples == 2
    # mean loss over the two inner steps, each taken before its step: ln 2 and −ln σ(0.2)
    assert update.loss == pytest.approx((math.log(2) - math.log(sigmoid(0.2))) / 2, rel=1e-6)
    # θ classifies both of its held-out points right; its loss there is −ln σ(2θ)
    assert update.metrics["personal_accuracy"] == 1.0
    assert update.metrics["personal_loss"] == pytest.approx(-math.log(sigmoid(2 * theta)), rel=1e-6)


def test_omega_is_the_moving_anchor_across_local_rounds():
    # R = 2, K = 1: the second round's prox term pulls θ towards ω after round 1, not towards the global.
    eta_p, lam, eta = 0.4, 3.0, 0.2
    a = -eta_p * ce_grad_coefficient(0.0)  # θ after round 1 (coefficient of U)
    w1 = eta * lam * a  # ω after round 1: 0 − ηλ(0 − θ)
    t2 = a - eta_p * (ce_grad_coefficient(a) + lam * (a - w1))
    w2 = w1 - eta * lam * (w1 - t2)
    algo, job, task = two_point_job(config_with(
        {"local_rounds": 2, "inner_steps": 1, "personal_lr": eta_p, "lam": lam}, lr=eta))
    update = algo.local_update(job, task, {})
    assert torch.allclose(update.state[PERSONAL]["linear.weight"], t2 * U, atol=1e-7)
    assert torch.allclose(update.tensors[MODEL]["linear.weight"], w2 * U, atol=1e-7)


def test_nesterov_inner_solver_by_hand():
    # torch SGD(nesterov): buf ← μ·buf + g (buf = g at first), θ ← θ − η_p(g + μ·buf).
    eta_p, lam, eta, mu = 0.4, 2.0, 0.25, 0.5
    g1 = ce_grad_coefficient(0.0)
    t1 = -eta_p * (g1 + mu * g1)
    g2 = ce_grad_coefficient(t1) + lam * t1
    buf = mu * g1 + g2
    t2 = t1 - eta_p * (g2 + mu * buf)
    algo, job, task = two_point_job(config_with(
        {"local_rounds": 1, "inner_steps": 2, "personal_lr": eta_p, "lam": lam},
        lr=eta, optimizer="nesterov", momentum=mu))
    update = algo.local_update(job, task, {})
    assert torch.allclose(update.state[PERSONAL]["linear.weight"], t2 * U, atol=1e-7)
    assert torch.allclose(update.tensors[MODEL]["linear.weight"], eta * lam * t2 * U, atol=1e-7)


def test_cloud_mixing_by_hand():
    # Edge 0 sent ω sums [4, 6] for 2 sampled clients, edge 1 sent [3, 0] for 1: mean ω = [7/3, 2].
    # β = 0.5: θ ← ½[1, 1] + ½[7/3, 2] = [5/3, 3/2]; β = 1 replaces θ by the mean.
    contributions = [Contribution(0, 0, {MODEL: {"w": torch.tensor([4.0, 6.0], dtype=torch.float64)}}, 2.0),
                     Contribution(1, 0, {MODEL: {"w": torch.tensor([3.0, 0.0], dtype=torch.float64)}}, 1.0)]
    for beta, expected in [(0.5, [5 / 3, 1.5]), (1.0, [7 / 3, 2.0]), (2.0, [11 / 3, 3.0])]:
        algo = PFedMe(RunConfig(**SMALL, params={"beta": beta}, topology={"num_edges": 2, "buffer_size": 2}))
        new, state = algo.cloud_update({MODEL: {"w": torch.ones(2)}}, contributions, {}, 0)
        assert new[MODEL]["w"].dtype == torch.float32
        assert torch.allclose(new[MODEL]["w"], torch.tensor(expected))
        assert state == {}


def omega_of(k: int) -> dict:
    return {MODEL: {"w": torch.tensor([float(k), 10.0 * k])}}


def test_edge_sums_only_its_uniform_sample():
    config = RunConfig(**{**SMALL, "data": {"dataset": "digits", "num_clients": 8}}, fraction=0.5)
    algo = PFedMe(config)
    everyone = list(range(8))
    assert algo.select(everyone, 3, 0) == everyone
    results = [ClientResult(k, 100 + k, 0.0, omega_of(k)) for k in reversed(everyone)]
    aggregate, state = algo.edge_aggregate(results, {}, 3)
    sample = select_clients(config, everyone, 3, 0)  # the (seed, round, edge) stream: m = ⌊0.5·8⌋ = 4
    assert len(sample) == 4
    # p_k = 1/|S| whatever the sample sizes: the weight is |S|, the sums plain sums of ω
    assert aggregate.weight == 4.0
    assert torch.equal(aggregate.tensors[MODEL]["w"],
                       torch.tensor([sum(sample), 10.0 * sum(sample)], dtype=torch.float64))
    assert state == {}


def test_edge_samples_among_the_clients_that_answered():
    config = RunConfig(**{**SMALL, "data": {"dataset": "digits", "num_clients": 8}}, fraction=0.5)
    answered = [0, 2, 3, 5, 7]  # 1, 4, 6 are stragglers
    aggregate, _ = PFedMe(config).edge_aggregate([ClientResult(k, 1, 0.0, omega_of(k)) for k in answered], {}, 1)
    sample = select_clients(config, answered, 1, 0)  # m = ⌊0.5·5⌋ = 2
    assert aggregate.weight == 2.0
    assert torch.equal(aggregate.tensors[MODEL]["w"],
                       torch.tensor([sum(sample), 10.0 * sum(sample)], dtype=torch.float64))


def test_each_edge_samples_its_own_clients():
    config = RunConfig(**{**SMALL, "data": {"dataset": "digits", "num_clients": 8}}, fraction=0.5,
                       topology={"num_edges": 2, "buffer_size": 2})
    algo = PFedMe(config)
    mine = config.clients_of_edge(1)  # 1, 3, 5, 7
    aggregate, _ = algo.edge_aggregate([ClientResult(k, 1, 0.0, omega_of(k)) for k in mine], {}, 0)
    sample = select_clients(config, mine, 0, 1)
    assert aggregate.weight == 2.0 and set(sample) <= set(mine)
    assert torch.equal(aggregate.tensors[MODEL]["w"],
                       torch.tensor([sum(sample), 10.0 * sum(sample)], dtype=torch.float64))
    with pytest.raises(ValueError, match="several edges"):
        algo.edge_aggregate([ClientResult(k, 1, 0.0, omega_of(k)) for k in (0, 1)], {}, 0)


def test_config_checks():
    with pytest.raises(ValueError, match="beta"):
        registry.check(RunConfig(**SMALL, server_lr=2.0))
    with pytest.raises(ValueError, match="edge_rounds"):
        registry.check(RunConfig(**SMALL, topology={"num_edges": 2, "buffer_size": 2, "edge_rounds": 2}))
    with pytest.raises(ValueError):
        registry.check(RunConfig(**SMALL, params={"lam": 0.0}))
    with pytest.raises(ValueError):
        registry.check(RunConfig(**SMALL, params={"inner_step": 3}))  # typo
    registry.check(RunConfig(**SMALL, topology={"num_edges": 2, "buffer_size": 2}))


def test_no_personal_metrics_without_a_held_out_split():
    model = build_model(ModelConfig(name="logreg"), (2,), 2)
    assert personal_metrics(model, ArrayDataset(torch.zeros(0, 2), torch.zeros(0, dtype=torch.int64))) == {}


REF = RunConfig(**{**SMALL, "local": {"lr": 0.1, "batch_size": 16}}, rounds=2, fraction=0.5,
                params={"local_rounds": 3, "inner_steps": 2, "personal_lr": 0.05, "lam": 5.0, "beta": 0.7})


def test_reference_runs_every_client_and_records_the_sample_s_with_its_personal_accuracy():
    a, b = run_reference(REF), run_reference(REF)
    for name in a.global_state:
        assert torch.equal(a.global_state[name], b.global_state[name])
    for r, record in enumerate(a.history):
        # Everyone trains every round (all six keep a θ_k, below), but only S's ω entered θ: the history
        # lists S, as every algorithm's lists the clients whose updates entered the model.
        sample = select_clients(REF, list(range(6)), r, 0)
        assert len(sample) == 3
        assert [c.client_id for c in record.clients] == sample
        acc = record.client_metrics["personal_accuracy"]
        assert 0.0 <= acc <= 1.0
        # the history's value is the training-sample-weighted mean of what the clients reported
        per_client = sum(c.metrics["personal_accuracy"] * c.num_samples for c in record.clients)
        assert acc == pytest.approx(per_client / sum(c.num_samples for c in record.clients))
    assert sorted(a.client_states) == list(range(6))
    for state in a.client_states.values():
        assert set(state) == {PERSONAL}
        assert {n: (t.shape, t.dtype) for n, t in state[PERSONAL].items()} ==\
            {n: (t.shape, torch.float32) for n, t in a.global_state.items()}
        # the state and the tensors survive safetensors unchanged
        back = st_load(st_save(state[PERSONAL]))
        assert all(torch.equal(back[n], t) for n, t in state[PERSONAL].items())


def test_reference_round_equals_the_rule_applied_to_the_hooks():
    """θ_1 = (1 − β)θ_0 + β/|S| Σ_{k∈S} ω_k, with S the edge's sample and ω_k each client's local_update."""
    algo = PFedMe(REF)
    theta0 = algo.init_global(initial_model(REF))
    data = load_federated(REF.data, REF.seed)
    sample = select_clients(REF, list(range(6)), 0, 0)
    assert len(sample) == 3
    omegas = [algo.local_update(local_job(REF, k, 0, data.clients[k]), theta0, {}).tensors[MODEL] for k in sample]
    result = run_reference(REF, rounds=1)
    for name, t in theta0[MODEL].items():
        mean = torch.stack([o[name].double() for o in omegas]).mean(0)
        expected = (0.3 * t.double() + 0.7 * mean).float()
        assert torch.allclose(result.global_state[name], expected, atol=1e-6), name
        assert result.global_state[name].dtype == torch.float32 and result.global_state[name].is_contiguous()


def test_two_edges_equal_one_edge_when_everyone_is_sampled():
    flat = run_reference(REF.model_copy(update={"fraction": 1.0}))
    hier = run_reference(RunConfig(**{**REF.model_dump(), "fraction": 1.0,
                                      "topology": {"num_edges": 2, "buffer_size": 2}}))
    for name in flat.global_state:
        assert torch.allclose(flat.global_state[name], hier.global_state[name], atol=1e-6)
    for f, h in zip(flat.history, hier.history, strict=True):
        assert f.client_metrics == pytest.approx(h.client_metrics)


def test_with_two_edges_the_history_lists_each_edges_own_sample():
    config = RunConfig(**{**REF.model_dump(), "topology": {"num_edges": 2, "buffer_size": 2}})
    result = run_reference(config, rounds=2)
    for r, record in enumerate(result.history):
        samples = {edge: select_clients(config, config.clients_of_edge(edge), r, edge) for edge in (0, 1)}
        assert all(len(s) == 1 for s in samples.values())  # m = ⌊0.5·3⌋ of each edge's three clients
        assert [(c.client_id, c.edge_id) for c in record.clients] ==\
            sorted((k, edge) for edge, s in samples.items() for k in s)
        assert [c.weight for c in record.contributions] == [1.0, 1.0]  # |S_l|
