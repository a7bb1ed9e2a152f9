import torch

from fl_services.shared.core.config import RunConfig
from fl_services.shared.core.reference import run_reference

BASE = dict(model={"name": "logreg"}, data={"dataset": "digits", "num_clients": 6}, rounds=3, fraction=0.5)


def test_fedsgd_equals_fedavg_with_one_epoch_full_batch():
    local = {"epochs": 1, "batch_size": 0, "lr": 0.3}
    sgd = run_reference(RunConfig(**BASE, algorithm="fedsgd", local=local))
    avg = run_reference(RunConfig(**BASE, algorithm="fedavg", local=local))
    for name in avg.global_state:
        assert torch.allclose(sgd.global_state[name], avg.global_state[name], atol=1e-6), name
    assert [[c.client_id for c in h.clients] for h in sgd.history] ==\
        [[c.client_id for c in h.clients] for h in avg.history]


def test_fedsgd_is_not_fedavg_with_minibatches():
    sgd = run_reference(RunConfig(**BASE, algorithm="fedsgd", local={"batch_size": 0, "lr": 0.3}))
    avg = run_reference(RunConfig(**BASE, algorithm="fedavg", local={"batch_size": 16, "lr": 0.3}))
    assert any(not torch.allclose(sgd.global_state[n], avg.global_state[n], atol=1e-4) for n in avg.global_state)


def test_fedsgd_learns():
    result = run_reference(RunConfig(**{**BASE, "rounds": 15}, algorithm="fedsgd", local={"lr": 0.5}))
    assert result.history[-1].test_accuracy > 0.8


def test_local_gradient_and_cloud_step_by_hand():
    """Zero logreg on e0→0, e1→1: g = mean((p − e_y) xᵀ) = [[-.25, .25], [.25, -.25]], g_b = 0, loss ln 2.
    Cloud, two edges with p = [1/4, 3/4] and η = 0.5: w − 0.5·(¼·[4, 0] + ¾·[0, 4]) = [1, 1] − [0.5, 1.5]."""
    from functools import partial

    from fl_services.shared.core.algorithms.base import MODEL, Contribution, LocalJob
    from fl_services.shared.core.algorithms.fedsgd import FedSGD
    from fl_services.shared.core.config import ModelConfig
    from fl_services.shared.core.data import ArrayDataset, ClientData
    from fl_services.shared.core.models import build_model

    algo = FedSGD(RunConfig(**BASE, algorithm="fedsgd", local={"lr": 0.5}))
    data = ArrayDataset(torch.tensor([[1.0, 0.0], [0.0, 1.0]]), torch.tensor([0, 1]))
    job = LocalJob(0, 0, ClientData(data, data), partial(build_model, ModelConfig(name="logreg"), (2,), 2),
                   torch.Generator())
    update = algo.local_update(job, {MODEL: {"linear.weight": torch.zeros(2, 2), "linear.bias": torch.zeros(2)}}, {})
    assert torch.allclose(update.tensors[MODEL]["linear.weight"], torch.tensor([[-0.25, 0.25], [0.25, -0.25]]))
    assert torch.allclose(update.tensors[MODEL]["linear.bias"], torch.zeros(2))
    assert abs(update.loss - 0.6931471805599453) < 1e-6
    contributions = [Contribution(0, 0, {MODEL: {"w": torch.tensor([4.0, 0.0], dtype=torch.float64)}}, 1.0),
                     Contribution(1, 0, {MODEL: {"w": torch.tensor([0.0, 12.0], dtype=torch.float64)}}, 3.0)]
    new, _ = algo.cloud_update({MODEL: {"w": torch.ones(2)}}, contributions, {}, 0)
    assert torch.allclose(new[MODEL]["w"], torch.tensor([0.5, -0.5]))
