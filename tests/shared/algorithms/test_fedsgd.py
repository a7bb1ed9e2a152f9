import torch

from shared.config import RunConfig
from shared.reference import run_reference

BASE = dict(model={"name": "logreg"}, data={"dataset": "digits", "num_clients": 6}, rounds=3, fraction=0.5)


def test_fedsgd_equals_fedavg_with_one_epoch_full_batch():
    local = {"epochs": 1, "batch_size": 0, "lr": 0.3}
    sgd = run_reference(RunConfig(**BASE, algorithm="fedsgd", local=local))
    avg = run_reference(RunConfig(**BASE, algorithm="fedavg", local=local))
    for name in avg.global_state:
        assert torch.allclose(sgd.global_state[name], avg.global_state[name], atol=1e-6), name
    assert [[c.client_id for c in h.clients] for h in sgd.history] == [[c.client_id for c in h.clients] for h in avg.history]


def test_fedsgd_is_not_fedavg_with_minibatches():
    sgd = run_reference(RunConfig(**BASE, algorithm="fedsgd", local={"batch_size": 0, "lr": 0.3}))
    avg = run_reference(RunConfig(**BASE, algorithm="fedavg", local={"batch_size": 16, "lr": 0.3}))
    assert any(not torch.allclose(sgd.global_state[n], avg.global_state[n], atol=1e-4) for n in avg.global_state)


def test_fedsgd_learns():
    result = run_reference(RunConfig(**{**BASE, "rounds": 15}, algorithm="fedsgd", local={"lr": 0.5}))
    assert result.history[-1].test_accuracy > 0.8
