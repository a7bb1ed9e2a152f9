"""FedProx's claim (Li et al. 2020, Fig. 1-2): on Synthetic(1, 1) with many local epochs, the proximal
term (μ = 1) keeps heterogeneous devices from drifting apart, so FedProx trains more stably and reaches
a lower loss than FedAvg (μ = 0).

Setting, as in the paper: 30 devices with their natural (power-law) data, multinomial logistic
regression, 10 devices per round (λ = 1/3), E = 20, B = 10, η_k = 0.01; 30 rounds instead of 200.
Metric: the loss of the global model, averaged over rounds 20-29 so that FedAvg's round-to-round swings
do not decide the outcome.

Measured (FedAvg vs FedProx μ = 1): the held-out loss averaged over rounds 20-29 (what the test asserts),
the final model's loss on all devices' training data, and the mean test accuracy over rounds 20-29:

    seed  train samples  held-out loss   final train loss  accuracy
    2     6.8k           1.58 vs 0.88    1.33 vs 0.83      0.680 vs 0.709   FedAvg swings between 1.3 and 2.1
    4     8.8k           0.65 vs 0.64    0.68 vs 0.64      0.801 vs 0.804
    5     5.2k           1.16 vs 1.05    1.06 vs 0.95      0.631 vs 0.634
    6     7.3k           0.78 vs 0.73    0.79 vs 0.70      0.817 vs 0.822
    7     7.5k           1.20 vs 0.87    1.09 vs 0.78      0.642 vs 0.722   FedAvg swings in rounds 8-14

μ = 1 slows the first rounds: averaged over rounds 10-19 instead, FedProx's training loss was behind for
seeds 4 (0.83 vs 0.79) and 5 (1.22 vs 1.19), far ahead for 2 and 7, level for 6. Over rounds 20-29 it
was ahead for every seed tried (held-out loss 3-45% lower). Seed 5 has the least data, so it is the
cheapest run (~80 s on an idle core).
"""
import pytest
import torch

from fl_services.shared.core.config import RunConfig
from fl_services.shared.core.data import ArrayDataset, load_federated
from fl_services.shared.core.federation import initial_model
from fl_services.shared.core.training import evaluate, load_parameters
from tests.parallel import run_references

SEED = 5
ROUNDS = 30
LATE = 20  # the rounds from here on are averaged


def _config(algorithm: str, params: dict) -> RunConfig:
    return RunConfig(
        seed=SEED, algorithm=algorithm, params=params, rounds=ROUNDS, fraction=1 / 3,
        model={"name": "logreg"},
        data={"dataset": "synthetic", "partition": "natural", "num_clients": 30,
              "synthetic_alpha": 1, "synthetic_beta": 1},
        local={"epochs": 20, "batch_size": 10, "lr": 0.01},
    )


def _train_loss(config: RunConfig, model_state: dict[str, torch.Tensor]) -> float:
    data = load_federated(config.data, config.seed)
    train = ArrayDataset(torch.cat([c.train.x for c in data.clients]), torch.cat([c.train.y for c in data.clients]))
    return evaluate(load_parameters(initial_model(config), model_state), train).loss


@pytest.mark.slow
def test_fedprox_beats_fedavg_on_synthetic_1_1():
    configs = {"fedavg": _config("fedavg", {}), "fedprox": _config("fedprox", {"mu": 1.0})}
    runs = dict(zip(configs, zip(configs.values(), run_references(*configs.values()), strict=True), strict=True))
    assert all(len(h.clients) == 10 for _, r in runs.values() for h in r.history)
    # The global test set is the union of the devices' held-out splits.
    late = {name: sum(h.test_loss for h in r.history[LATE:]) / (ROUNDS - LATE) for name, (_, r) in runs.items()}
    final = {name: _train_loss(config, r.global_state) for name, (config, r) in runs.items()}
    # Measured for seed 5: held-out loss 1.16 vs 1.05 (mean of rounds 20-29), final training loss 1.06 vs 0.95.
    assert late["fedprox"] < 0.95 * late["fedavg"], late
    assert final["fedprox"] < 0.95 * final["fedavg"], final
