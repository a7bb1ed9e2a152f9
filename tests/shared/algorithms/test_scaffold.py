"""SCAFFOLD against numbers derived by hand, state persistence, and the wire contract."""
import math
from functools import partial

import pytest
import torch

from fl_services.shared.core.algorithms import registry
from fl_services.shared.core.algorithms.base import MODEL, ClientResult, Contribution, LocalJob
from fl_services.shared.core.algorithms.control import CONTROL, step_length
from fl_services.shared.core.algorithms.scaffold import Scaffold
from fl_services.shared.core.config import LocalTrainingConfig, ModelConfig, RunConfig
from fl_services.shared.core.data import ArrayDataset, ClientData, load_federated
from fl_services.shared.core.federation import initial_model, local_job, participation
from fl_services.shared.core.models import build_model
from fl_services.shared.core.records import decode_state, encode, spec_of
from fl_services.shared.core.reference import run_reference
from fl_services.shared.core.roster import selected_count

SMALL = {"model": {"name": "logreg"}, "data": {"dataset": "digits", "num_clients": 6}, "algorithm": "scaffold"}
M = torch.tensor([[-1.0, 1.0], [1.0, -1.0]])
W, B = "linear.weight", "linear.bias"


def _job() -> LocalJob:
    data = ArrayDataset(torch.tensor([[1.0, 0.0], [0.0, 1.0]]), torch.tensor([0, 1]))
    return LocalJob(0, 0, ClientData(data, data), partial(build_model, ModelConfig(name="logreg"), (2,), 2),
                    torch.Generator().manual_seed(0))


def _zero_task(c_w: torch.Tensor, c_b: torch.Tensor) -> dict[str, dict[str, torch.Tensor]]:
    return {MODEL: {W: torch.zeros(2, 2), B: torch.zeros(2)}, CONTROL: {W: c_w, B: c_b}}


def test_one_step_control_is_the_gradient():
    # K = 1, full batch, zero logreg on x0 = e1 (y=0), x1 = e2 (y=1): ∇W = 0.25·M, ∇b = 0 (softmax [.5, .5]).
    # With c_k = 0 (no state yet) and c = (C, [.1, −.1]):
    #   w_k = −η(∇ − c_k + c), so (w − w_k)/(1·η) = ∇ + c and c_k⁺ = 0 − c + ∇ + c = ∇: (0.25·M, 0).
    C = torch.tensor([[0.2, 0.0], [0.0, -0.4]])
    config = RunConfig(**SMALL, local={"epochs": 1, "batch_size": 0, "lr": 0.5})
    update = Scaffold(config).local_update(_job(), _zero_task(C, torch.tensor([0.1, -0.1])), {})
    assert torch.allclose(update.tensors[MODEL][W], -0.5 * (0.25 * M + C))
    assert torch.allclose(update.tensors[MODEL][B], -0.5 * torch.tensor([0.1, -0.1]))
    assert torch.allclose(update.state[CONTROL][W], 0.25 * M, atol=1e-7)
    assert torch.allclose(update.state[CONTROL][B], torch.zeros(2), atol=1e-7)
    assert torch.allclose(update.tensors[CONTROL][W], 0.25 * M, atol=1e-7)  # Δc_k = c_k⁺ − 0
    assert set(update.state) == {CONTROL} and set(update.state[CONTROL]) == {W, B}


def test_two_steps_with_client_state_by_hand():
    # η = 0.5, K = E·|𝓑| = 2 full-batch steps. c_k = (D, [.3, −.3]) from the client's state and
    # c = c_k + (δ·M, 0) with δ = 0.05, so the correction c − c_k is δ·M on W and 0 on b.
    # Step 1: ∇W = 0.25·M, ∇b = 0, so w1 = −η(0.25 + δ)·M = 0.15·[[1, −1], [−1, 1]], b1 = 0.
    # Step 2: logits of x0 are W1[:, 0] = [.15, −.15], p(y=0|x0) = σ(0.3) =: s, likewise p(y=1|x1) = s;
    #   ∇W = (1 − s)/2·M =: q·M, ∇b = 0, so w2 = w1 − η(q + δ)·M = −η(0.25 + q + 2δ)·M.
    # Δw = w2;  c_k⁺ = c_k − c + (0 − w2)/(2η) = −δM + (0.25 + q + 2δ)/2·M = (0.25 + q)/2·M on W (the mean
    # gradient), and c_k − c = 0 on b, so c_k⁺ = (0.25 + q)/2·M, [0, 0] and Δc_k = c_k⁺ − c_k.
    s = 1 / (1 + math.exp(-0.3))
    q = (1 - s) / 2
    D, b_k = torch.tensor([[0.1, 0.0], [0.0, 0.1]]), torch.tensor([0.3, -0.3])
    config = RunConfig(**SMALL, local={"epochs": 2, "batch_size": 0, "lr": 0.5})
    state = {CONTROL: {W: D.clone(), B: b_k.clone()}}
    update = Scaffold(config).local_update(_job(), _zero_task(D + 0.05 * M, b_k.clone()), state)
    assert torch.allclose(update.tensors[MODEL][W], -0.5 * (0.25 + q + 0.1) * M, atol=1e-6)
    assert torch.allclose(update.tensors[MODEL][B], torch.zeros(2), atol=1e-7)
    c_plus = (0.25 + q) / 2 * M
    assert torch.allclose(update.state[CONTROL][W], c_plus, atol=1e-6)
    assert torch.allclose(update.state[CONTROL][B], torch.zeros(2), atol=1e-7)
    assert torch.allclose(update.tensors[CONTROL][W], c_plus - D, atol=1e-6)
    assert torch.allclose(update.tensors[CONTROL][B], -b_k, atol=1e-7)
    assert update.loss == pytest.approx((math.log(2) + math.log(1 + math.exp(-0.3))) / 2, rel=1e-6)
    assert torch.equal(state[CONTROL][W], D)  # the caller's state is not modified in place


def test_nesterov_step_length_by_hand():
    # torch Nesterov, constant g: b1 = g, step η(g + βb1) = 1.9ηg; b2 = 1.9g, step η(g + 0.9·1.9g) = 2.71ηg.
    nag = LocalTrainingConfig(lr=0.1, optimizer="nesterov", momentum=0.9)
    assert step_length(nag, 1) == pytest.approx(0.19)
    assert step_length(nag, 2) == pytest.approx(0.1 * (1.9 + 2.71))
    assert step_length(LocalTrainingConfig(lr=0.1, optimizer="sgd", momentum=0.9), 7) == pytest.approx(0.7)


def test_nesterov_one_step_control_is_the_gradient():
    # K = 1 Nesterov step: w_k = −η(1 + β)(∇ + c − c_k), and dividing by the step length η(1 + β) gives c_k⁺ = ∇.
    C = torch.tensor([[0.2, 0.0], [0.0, -0.4]])
    config = RunConfig(**SMALL, local={"epochs": 1, "batch_size": 0, "lr": 0.5, "optimizer": "nesterov",
                                       "momentum": 0.5})
    update = Scaffold(config).local_update(_job(), _zero_task(C, torch.zeros(2)), {})
    assert torch.allclose(update.tensors[MODEL][W], -0.75 * (0.25 * M + C))
    assert torch.allclose(update.state[CONTROL][W], 0.25 * M, atol=1e-7)


def test_cloud_update_by_hand():
    # N = 6, λ = 1/3: m = 2. Clients with 1 and 3 samples: p = [1/4, 3/4].
    # Δw = [1, 0], [0, 1]; Δc = [.4, 0], [0, .8]:  Σ p Δw = [.25, .75], Σ p Δc = [.1, .6].
    # w = [1, 1] + η_s·[.25, .75];  c = [.5, 0] + (2/6)·[.1, .6] = [.5 + 1/30, .2].
    algo = Scaffold(RunConfig(**SMALL, fraction=1 / 3, server_lr=2.0))
    results = [
        ClientResult(4, 3, 0.0, {MODEL: {"w": torch.tensor([0.0, 1.0])}, CONTROL: {"w": torch.tensor([0.0, 0.8])}}),
        ClientResult(1, 1, 0.0, {MODEL: {"w": torch.tensor([1.0, 0.0])}, CONTROL: {"w": torch.tensor([0.4, 0.0])}}),
    ]
    partial_, _ = algo.edge_aggregate(results, {}, 0)
    global_ = {MODEL: {"w": torch.ones(2)}, CONTROL: {"w": torch.tensor([0.5, 0.0])}}
    new, _ = algo.cloud_update(global_, [Contribution(0, 0, partial_.tensors, partial_.weight,
                                                    tuple(participation(results)))], {}, 0)
    assert torch.allclose(new[MODEL]["w"], torch.tensor([1.5, 2.5]))
    assert torch.allclose(new[CONTROL]["w"], torch.tensor([0.5 + 1 / 30, 0.2]))
    assert new[MODEL]["w"].dtype == new[CONTROL]["w"].dtype == torch.float32


def test_m_counts_the_clients_every_edge_selects():
    # Two edges of 3 clients at λ = 0.5 select max(⌊1.5⌋, 1) = 1 each: m = 2, not ⌊0.5·6⌋ = 3.
    def m(config: RunConfig) -> int:
        return selected_count(config, [Contribution(e, 0, {}, 1.0) for e in range(config.topology.num_edges)])

    assert m(RunConfig(**SMALL, fraction=0.5)) == 3
    two = RunConfig(**SMALL, fraction=0.5, topology={"num_edges": 2, "buffer_size": 2})
    assert m(two) == 2
    assert all(len(h.clients) == 2 for h in run_reference(two, rounds=2).history)


def test_global_state_and_model_parameters():
    config = RunConfig(**SMALL)
    algo = Scaffold(config)
    global_ = algo.init_global(initial_model(config))
    assert set(global_) == {MODEL, CONTROL} and set(global_[MODEL]) == set(global_[CONTROL]) == {W, B}
    assert torch.equal(global_[CONTROL][W], torch.zeros(10, 64)) and torch.equal(global_[CONTROL][B], torch.zeros(10))
    assert set(algo.model_parameters(global_)) == {W, B}


def test_wire_contract_and_safetensors_round_trip():
    """result_spec and contribution_spec describe exactly what local_update and edge_aggregate produce."""
    config = RunConfig(**SMALL, local={"epochs": 2, "batch_size": 16, "lr": 0.1})
    algo = Scaffold(config)
    global_ = algo.init_global(initial_model(config))
    global_[CONTROL][W] = torch.full_like(global_[CONTROL][W], 0.01)
    data = load_federated(config.data, config.seed)
    results, state = [], {}
    for k in (1, 2):
        task = algo.client_task(global_, k, 0)
        update = algo.local_update(local_job(config, k, 0, data.clients[k]), task, {})
        assert spec_of(update.tensors) == algo.result_spec(task)
        state = update.state
        results.append(ClientResult(k, update.num_samples, update.loss, update.tensors))
    for tensors in (results[0].tensors, state):
        back = decode_state(encode(tensors))
        assert all(torch.equal(back[g][n], t) for g, ts in tensors.items() for n, t in ts.items())
    assert spec_of(state) == {CONTROL: {W: ((10, 64), torch.float32), B: ((10,), torch.float32)}}
    partial_, _ = algo.edge_aggregate(results, {}, 0)
    assert spec_of(partial_.tensors) == algo.contribution_spec(global_, [1, 2])
    assert all(t.dtype == torch.float64 for ts in partial_.tensors.values() for t in ts.values())


BASE = dict(SMALL, rounds=2, fraction=0.5, local={"lr": 0.1, "epochs": 2, "batch_size": 16})


@pytest.mark.parametrize("weighting", ["uniform", "samples"])
def test_client_controls_persist_across_rounds(weighting):
    one = run_reference(RunConfig(**BASE, weighting=weighting), rounds=1)
    two = run_reference(RunConfig(**BASE, weighting=weighting), rounds=2)
    first, second = ({c.client_id for c in h.clients} for h in two.history)
    assert set(one.client_states) == first and set(two.client_states) == first | second
    for k in first - second:  # kept on the client, untouched while it sits out
        assert all(torch.equal(one.client_states[k][CONTROL][n], two.client_states[k][CONTROL][n]) for n in (W, B))
    for k in first & second:
        assert not torch.equal(one.client_states[k][CONTROL][W], two.client_states[k][CONTROL][W])
    if weighting == "uniform":
        # p_k = 1/m, so c ← c + (1/N) Σ_{k∈S} Δc_k: from zeros, c stays the mean of all N client controls (a
        # client that never trained holds 0). This fails if c_k were not carried from round to round.
        for n in (W, B):
            mean = sum(s[CONTROL][n].double() for s in two.client_states.values()) / 6
            assert torch.allclose(two.global_record[CONTROL][n].double(), mean, atol=1e-6)


def test_reference_is_deterministic_and_learns():
    config = RunConfig(**{**BASE, "rounds": 4})
    a, b = run_reference(config), run_reference(config)
    for name in a.global_state:
        assert torch.equal(a.global_state[name], b.global_state[name])
    assert all(len(h.clients) == 3 for h in a.history)
    assert a.history[-1].test_accuracy > 0.8


def test_two_edges_equal_one_edge_when_everyone_participates():
    """Edges send partial sums of Δw and Δc, and c is one global tensor: splitting the clients changes nothing."""
    everyone = {**BASE, "fraction": 1.0, "rounds": 3}
    flat = run_reference(RunConfig(**everyone))
    hier = run_reference(RunConfig(**everyone, topology={"num_edges": 2, "buffer_size": 2}))
    for name in flat.global_state:
        assert torch.allclose(flat.global_state[name], hier.global_state[name], atol=1e-6), name
    for k in range(6):
        assert torch.allclose(flat.client_states[k][CONTROL][W], hier.client_states[k][CONTROL][W], atol=1e-5)


def test_edge_rounds_are_refused():
    with pytest.raises(ValueError, match="edge_rounds"):
        registry.check(RunConfig(**SMALL, topology={"num_edges": 2, "buffer_size": 2, "edge_rounds": 2}))


def test_nesterov_stays_stable_on_skewed_clients():
    """The momentum-aware denominator keeps c bounded (dividing by K·η_k instead blows c up to ~1e12 here)."""
    skewed = {"dataset": "digits", "num_clients": 6, "partition": "dirichlet", "alpha": 0.3}
    config = RunConfig(**{**SMALL, "data": skewed},
                       local={"lr": 0.02, "epochs": 2, "optimizer": "nesterov"}, rounds=8)
    result = run_reference(config)
    assert max(float(t.abs().max()) for t in result.global_record[CONTROL].values()) < 1.0
    assert result.history[-1].test_accuracy > 0.85
