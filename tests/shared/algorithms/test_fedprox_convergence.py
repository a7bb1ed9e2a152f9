"""FedProx's claim (Li et al. 2020, Fig. 1-2): on Synthetic(1, 1) with many local epochs, the proximal
term (μ = 1) keeps heterogeneous devices from drifting apart, so FedProx trains more stably and reaches
a lower loss than FedAvg (μ = 0).

Setting, as in the paper: 30 devices with their natural (power-law) data, multinomial logistic
regression, 10 devices per round (λ = 1/3), E = 20, B = 10, η_k = 0.01; 15 rounds instead of 200.
Metric: the loss of the global model, averaged over rounds 10-14 so that FedAvg's round-to-round swings
do not decide the outcome, and its final loss on all devices' training data.

Measured (FedAvg vs FedProx μ = 1): the held-out loss averaged over rounds 10-14 and the final training loss
of 15-round runs (the test's setting), and the held-out loss averaged over rounds 10-19 and 20-29 of longer runs:

    seed  train samples  rounds 10-14   final train   rounds 10-19   rounds 20-29
    20    4.5k           1.34 vs 1.12   1.35 vs 1.06  1.36 vs 1.06   1.28 vs 0.89   FedAvg swings from round 1 on
    36    5.6k           1.55 vs 1.21   1.84 vs 1.16  1.69 vs 1.14                  FedAvg swings, climbs from round 12
    10    5.0k           1.36 vs 1.22   1.31 vs 1.15  1.35 vs 1.19   1.21 vs 1.06
    8     5.4k           1.06 vs 1.05   0.87 vs 0.84  0.98 vs 0.92                  FedProx ahead from round 13
    5     5.2k           1.29 vs 1.34   1.23 vs 1.26
    26    4.4k                                        0.93 vs 1.04   0.81 vs 0.81   FedAvg trains smoothly
    32    3.4k                                        1.06 vs 1.08   0.83 vs 0.86   FedAvg trains smoothly

The proximal term pays where the devices' drift makes FedAvg swing (seeds 20, 36 and 10 here; earlier 30-round
runs of seeds 2, 4, 5, 6 and 7 were lower for each over rounds 20-29, by 1.5-45%), on some seeds only later (5 and
8 are level or behind over rounds 10-14); where FedAvg already trains smoothly, μ = 1 mostly slows the first
rounds (26 and 32), and FedProx is level or behind. Seed 20 is the test's: of those where FedAvg swings, the least
data, and FedProx lower in every round from the first, so that 15 rounds keep a clear margin (FedAvg's lowest
training loss over rounds 10-14, 1.20, is still 12% above FedProx's final one), at three quarters of 20 rounds'
cost (~7 core-seconds for both runs).
"""

import pytest
import torch

from fl_services.shared.core.config import RunConfig
from fl_services.shared.core.data import ArrayDataset, load_federated
from fl_services.shared.core.federation import initial_model
from fl_services.shared.core.reference import run_reference
from fl_services.shared.core.training import evaluate, load_parameters

SEED = 20
ROUNDS = 15
LATE = 10  # the rounds from here on are averaged


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
    runs = {name: (config, run_reference(config)) for name, config in configs.items()}
    assert all(len(h.clients) == 10 for _, r in runs.values() for h in r.history)
    # The global test set is the union of the devices' held-out splits.
    late = {name: sum(h.test_loss for h in r.history[LATE:]) / (ROUNDS - LATE) for name, (_, r) in runs.items()}
    final = {name: _train_loss(config, r.global_state) for name, (config, r) in runs.items()}
    # Measured for seed 20: held-out loss 1.34 vs 1.12 (mean of rounds 10-14), final training loss 1.35 vs 1.06.
    assert late["fedprox"] < 0.95 * late["fedavg"], late
    assert final["fedprox"] < 0.95 * final["fedavg"], final
