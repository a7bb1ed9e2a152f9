"""FedVARP's claim: at low participation (λ = 0.1) its final training loss is lower than FedAvg's.

Setting: MNIST 5k, 20 clients with 2 label shards each, McMahan's 2NN (mlp), λ = 0.1 (m = 2 clients a
round), E = 2, B = 16, η_k = 0.05, 60 rounds, seed 0. "Final training loss" is the global model's mean
cross-entropy on all clients' training data pooled, averaged over the last 10 rounds; the test records it
each round by wrapping the reference runner's per-round evaluation (run_reference has no other per-round
hook), so both algorithms are scored on the same data the same way.

Measured (FedAvg → FedVARP, last-10-round mean): seed 0: 0.493 → 0.254; seed 1: 0.588 → 0.372;
seed 2: 0.556 → 0.437; seed 3: 0.591 → 0.381. The assertion asks for a 15% reduction, which holds for
all four seeds (the worst ratio is 0.79).
"""
import pytest
import torch

from fl_services.shared.core import cloud_round
from fl_services.shared.core.config import RunConfig
from fl_services.shared.core.data import ArrayDataset, load_federated
from fl_services.shared.core.federation import initial_model
from fl_services.shared.core.reference import run_reference
from fl_services.shared.core.training import evaluate, load_parameters

CONFIG = {
    "model": {"name": "mlp"},
    "data": {"dataset": "mnist5k", "num_clients": 20, "partition": "shards", "shards_per_client": 2},
    "fraction": 0.1,
    "rounds": 60,
    "local": {"epochs": 2, "lr": 0.05, "batch_size": 16},
    "seed": 0,
}
LAST = 10


def pooled_training_data(config: RunConfig) -> ArrayDataset:
    data = load_federated(config.data, config.seed)
    return ArrayDataset(torch.cat([c.train.x for c in data.clients]), torch.cat([c.train.y for c in data.clients]))


def training_losses(config: RunConfig, monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The global model's loss on the pooled training data after every round."""
    pool, losses = pooled_training_data(config), []
    evaluate_global = cloud_round.evaluate_global

    def recording(cfg, algorithm, global_, *rest):
        model = load_parameters(initial_model(cfg), algorithm.model_parameters(global_))
        losses.append(evaluate(model, pool).loss)
        return evaluate_global(cfg, algorithm, global_, *rest)

    with monkeypatch.context() as patch:
        patch.setattr(cloud_round, "evaluate_global", recording)
        run_reference(config)
    assert len(losses) == config.rounds
    return losses


@pytest.mark.slow
def test_fedvarp_has_lower_final_training_loss_than_fedavg_at_low_participation(monkeypatch):
    final = {
        algorithm: sum(training_losses(RunConfig(**CONFIG, algorithm=algorithm), monkeypatch)[-LAST:]) / LAST
        for algorithm in ("fedavg", "fedvarp")
    }
    assert final["fedvarp"] < 0.85 * final["fedavg"], final
