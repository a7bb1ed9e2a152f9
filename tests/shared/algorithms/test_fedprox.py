"""FedProx against numbers derived by hand, plus what it inherits from FedAvg."""
import math
from functools import partial

import pytest
import torch
from pydantic import ValidationError

from fl_services.shared.core.algorithms import registry
from fl_services.shared.core.algorithms.base import MODEL, LocalJob
from fl_services.shared.core.algorithms.fedprox import FedProx
from fl_services.shared.core.config import ModelConfig, RunConfig
from fl_services.shared.core.data import ArrayDataset, ClientData
from fl_services.shared.core.federation import initial_model
from fl_services.shared.core.models import build_model
from fl_services.shared.core.reference import run_reference
from fl_services.shared.core.training import parameters_of

SMALL = {"model": {"name": "logreg"}, "data": {"dataset": "digits", "num_clients": 6}, "local": {"lr": 0.1}}


def _job() -> LocalJob:
    data = ArrayDataset(torch.tensor([[1.0, 0.0], [0.0, 1.0]]), torch.tensor([0, 1]))
    return LocalJob(0, 0, ClientData(data, data), partial(build_model, ModelConfig(name="logreg"), (2,), 2),
                    torch.Generator().manual_seed(0))


@pytest.mark.parametrize("mu", [0.0, 1.0, 4.0])
def test_two_full_batch_steps_by_hand(mu):
    # Data x0 = e1 (y=0), x1 = e2 (y=1); zero logreg; M = [[-1, 1], [1, -1]]; η = 0.1.
    # Step 1 at w_k = w = 0: softmax [.5, .5], ∇W = 0.25·M, ∇b = 0; the proximal gradient μ(w_k − w) = 0.
    #   w1 = −0.1·0.25·M = 0.025·[[1, -1], [-1, 1]], b1 = 0.
    # Step 2: logits of x0 are W1[:, 0] = [.025, −.025], so p(y=0|x0) = σ(0.05) =: s, and symmetrically
    #   p(y=1|x1) = s; ∇W = (1 − s)/2·M =: q·M, ∇b = 0; proximal gradient μ·w1.
    #   w2 = w1 − 0.1(q·M + μ·w1) = (0.025(1 − 0.1μ) + 0.1q)·[[1, -1], [-1, 1]].
    s = 1 / (1 + math.exp(-0.05))
    q = (1 - s) / 2
    a = 0.025 * (1 - 0.1 * mu) + 0.1 * q
    config = RunConfig(**{**SMALL, "local": {"epochs": 2, "batch_size": 0, "lr": 0.1}}, algorithm="fedprox",
                       params={"mu": mu})
    task = {MODEL: {"linear.weight": torch.zeros(2, 2), "linear.bias": torch.zeros(2)}}
    update = FedProx(config).local_update(_job(), task, {})
    assert torch.allclose(update.tensors[MODEL]["linear.weight"], torch.tensor([[a, -a], [-a, a]]), atol=1e-7)
    assert torch.allclose(update.tensors[MODEL]["linear.bias"], torch.zeros(2), atol=1e-7)
    # The reported loss is the data loss alone, the mean over the two steps: (ln 2 + ln(1 + e^{−0.05}))/2.
    assert update.loss == pytest.approx((math.log(2) + math.log(1 + math.exp(-0.05))) / 2, rel=1e-6)
    assert update.num_samples == 2 and update.state == {}


def test_proximal_gradient_by_hand():
    # w = (ones(2,2), 0), w_k = (3·ones(2,2), [1, 2]): the gradient of μ/2 ‖w_k − w‖² at μ = 2 is μ(w_k − w) =
    # (4·ones, [2, 4]), added to the data loss's (ones here).
    algo = FedProx(RunConfig(**SMALL, algorithm="fedprox", params={"mu": 2.0}))
    centre = {"linear.weight": torch.ones(2, 2), "linear.bias": torch.zeros(2)}
    proximal = algo.proximal(centre)
    assert proximal is not None
    centre["linear.weight"].fill_(100.0)  # the term keeps its own copy of the centre
    model = build_model(ModelConfig(name="logreg"), (2,), 2)
    with torch.no_grad():
        model.linear.weight.fill_(3.0)
        model.linear.bias.copy_(torch.tensor([1.0, 2.0]))
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    proximal.adder(dict(model.named_parameters()))()
    assert torch.equal(model.linear.weight.grad, torch.full((2, 2), 5.0))
    assert torch.equal(model.linear.bias.grad, torch.tensor([3.0, 5.0]))


def test_params():
    assert FedProx(RunConfig(**SMALL, algorithm="fedprox")).params.mu == 0.01
    with pytest.raises(ValidationError):
        registry.check(RunConfig(**SMALL, algorithm="fedprox", params={"mu": -1.0}))
    with pytest.raises(ValidationError):
        registry.check(RunConfig(**SMALL, algorithm="fedprox", params={"nu": 1.0}))
    assert FedProx(RunConfig(**SMALL, algorithm="fedprox", params={"mu": 0})).proximal({}) is None


BASE = dict(SMALL, rounds=2, fraction=0.5, local={"lr": 0.1, "epochs": 2, "batch_size": 16})


def test_mu_zero_is_fedavg_and_mu_pulls_towards_the_global_model():
    avg = run_reference(RunConfig(**BASE, algorithm="fedavg"))
    prox0 = run_reference(RunConfig(**BASE, algorithm="fedprox", params={"mu": 0.0}))
    prox = run_reference(RunConfig(**BASE, algorithm="fedprox", params={"mu": 5.0}))
    for name in avg.global_state:
        assert torch.equal(avg.global_state[name], prox0.global_state[name])
    def selected(result):
        return [[c.client_id for c in h.clients] for h in result.history]

    assert selected(prox) == selected(avg)
    assert all(len(h.clients) == 3 for h in prox.history)
    # Both start from the same initial model; the proximal term shortens the first round's step.
    first_avg = run_reference(RunConfig(**BASE, algorithm="fedavg"), rounds=1).global_state
    first_prox = run_reference(RunConfig(**BASE, algorithm="fedprox", params={"mu": 5.0}), rounds=1).global_state
    w0 = parameters_of(initial_model(RunConfig(**BASE)))

    def step(g: dict[str, torch.Tensor]) -> float:
        return sum(float((g[n] - w0[n]).norm() ** 2) for n in g)

    assert step(first_prox) < 0.8 * step(first_avg)


def test_reference_is_deterministic():
    config = RunConfig(**BASE, algorithm="fedprox", params={"mu": 0.5})
    a, b = run_reference(config), run_reference(config)
    for name in a.global_state:
        assert torch.equal(a.global_state[name], b.global_state[name])


def test_two_edges_equal_one_edge_when_everyone_participates():
    kwargs = dict(BASE, fraction=1.0, algorithm="fedprox", params={"mu": 0.5})
    flat = run_reference(RunConfig(**kwargs))
    hier = run_reference(RunConfig(**kwargs, topology={"num_edges": 2, "buffer_size": 2}))
    for name in flat.global_state:
        assert torch.allclose(flat.global_state[name], hier.global_state[name], atol=1e-6)


def test_hierarchical_edge_rounds_run_and_learn():
    config = RunConfig(**{**BASE, "rounds": 3}, algorithm="fedprox", params={"mu": 0.1},
                       topology={"num_edges": 2, "buffer_size": 2, "edge_rounds": 2})
    result = run_reference(config)
    assert result.history[-1].test_accuracy > 0.8
    assert all(len(h.clients) == 4 for h in result.history)  # per edge: 1 of its 3 clients × 2 edge rounds
