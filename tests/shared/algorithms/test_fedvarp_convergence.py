"""FedVARP's claim: at low participation (λ = 0.1) its final training loss is lower than FedAvg's.

Setting: MNIST 5k, 20 clients with 2 label shards each, McMahan's 2NN (mlp), λ = 0.1 (m = 2 clients a
round), E = 2, B = 16, η_k = 0.05, 40 rounds, seed 0. "Final training loss" is the global model's mean
cross-entropy on all clients' training data pooled, averaged over the last 10 rounds; the test records it
each round by wrapping the reference runner's per-round evaluation (run_reference has no other per-round
hook), so both algorithms are scored on the same data the same way.

Measured (FedAvg → FedVARP, mean of the 10 rounds before round R):

    seed   R = 30          R = 40          R = 50          R = 60
    0      0.916 → 0.557   0.738 → 0.410   0.644 → 0.319   0.493 → 0.254
    1      0.785 → 0.818   0.754 → 0.591   0.536 → 0.434   0.588 → 0.372
    2      0.767 → 0.842   0.806 → 0.519   0.571 → 0.431   0.556 → 0.437
    3      1.106 → 0.760   0.900 → 0.621   0.743 → 0.379   0.591 → 0.381

The assertion asks for a 15% reduction. 40 rounds is the fewest of these where it holds for all four seeds
with the margin of 60 rounds (worst ratio 0.78 against 0.79); at 30, FedVARP is still behind for seeds 1 and 2.
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
    "rounds": 40,
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
