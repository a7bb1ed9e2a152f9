"""The issue's claim: FedRolex with capacities {1, ½, ¼} stays within a few points of full-capacity FedAvg.

MNIST 5k, 12 IID clients, all of them every round, McMahan's 2NN (two hidden layers of 200 units),
E = 2, B = 32, η_k = 0.05, 12 rounds. Clients get β_k = [1, ½, ¼][k mod 3] (the default), so a third
of them train 200·200, a third 100·100 and a third 50·50 of the hidden-to-hidden weights.
Final test accuracy measured (FedRolex / FedAvg):

    rounds   seed 0          seed 1          seed 2
    10       0.868 / 0.900   0.867 / 0.881   0.903 / 0.908
    12       0.886 / 0.900   0.874 / 0.886   0.906 / 0.910
    15       0.892 / 0.905   0.877 / 0.894   0.898 / 0.907

The test asserts FedAvg > 85% and a gap ≤ 5 points. 12 rounds is the fewest of these with the margins of 15
(gaps of at most 1.4 points, FedAvg at least 88.6%); at 10 seed 0's gap is 3.2 points.
"""
import pytest

from fl_services.shared.core.config import RunConfig
from fl_services.shared.core.reference import run_reference


@pytest.mark.slow
def test_fedrolex_stays_within_five_points_of_full_capacity_fedavg():
    config = RunConfig(
        seed=0, algorithm="fedrolex", rounds=12, model={"name": "mlp"},
        data={"dataset": "mnist5k", "num_clients": 12, "partition": "iid"},
        local={"epochs": 2, "batch_size": 32, "lr": 0.05},
    )
    rolex = run_reference(config).history[-1].test_accuracy
    fedavg = run_reference(config.model_copy(update={"algorithm": "fedavg"})).history[-1].test_accuracy
    assert fedavg > 0.85
    assert rolex >= fedavg - 0.05, f"FedRolex {rolex:.3f} vs FedAvg {fedavg:.3f}"
