"""pFedMe's claim: on shard-partitioned MNIST (about two classes per client) each client's personalised
model θ_k, tested on the client's own held-out split, is more accurate than the global model θ, whether θ
is tested on the pooled test set or on the same client splits."""
import pytest

from fl_services.shared.core.config import RunConfig
from fl_services.shared.core.data import load_federated
from fl_services.shared.core.federation import initial_model
from fl_services.shared.core.reference import run_reference
from fl_services.shared.core.training import evaluate, load_parameters

# Measured after round 5 (global accuracy on the pooled test set / final global model on the clients'
# own held-out splits / mean personalised accuracy), one thread, ~25-30 s each:
#   seed 0: 0.740 / 0.725 / 0.956    seed 1: 0.801 / 0.800 / 0.964    seed 2: 0.783 / 0.765 / 0.964
# The smallest per-round gap personal − global over the three seeds is 0.163 (seed 1, round 4).
# personal_lr 0.09 (the authors' MNIST value) makes θ_k oscillate on these standardised inputs
# (personalised accuracy ≈ 0.5: one class per client); 0.03 is stable.
CONFIG = dict(
    algorithm="pfedme", rounds=5, fraction=1.0, model={"name": "mlp"},
    data={"dataset": "mnist5k", "partition": "shards", "num_clients": 10},
    local={"lr": 0.2, "batch_size": 20},
    params={"local_rounds": 20, "inner_steps": 5, "personal_lr": 0.03, "lam": 15.0, "beta": 1.0},
)


@pytest.mark.slow
def test_personalised_accuracy_beats_global_accuracy_on_shards():
    config = RunConfig(**CONFIG, seed=0)
    result = run_reference(config)
    last = result.history[-1]
    personal = last.client_metrics["personal_accuracy"]
    # The same comparison on the same data: the final global model on every client's held-out split,
    # weighted like the history's personalised mean (by training samples).
    data = load_federated(config.data, config.seed)
    model = load_parameters(initial_model(config), result.global_state)
    weights = [len(c.train) for c in data.clients]
    weighted = sum(w * evaluate(model, c.test).accuracy for w, c in zip(weights, data.clients, strict=True))
    global_on_clients = weighted / sum(weights)
    print(f"global {last.test_accuracy:.3f}, global on client splits {global_on_clients:.3f}, personal {personal:.3f}")
    assert last.test_accuracy > 0.65  # the global model learns too; the claim is not against a broken one
    assert personal > last.test_accuracy + 0.12
    assert personal > global_on_clients + 0.12
    # Personalised models are ahead from the first round on, not just at the end.
    assert all(h.client_metrics["personal_accuracy"] > h.test_accuracy + 0.12 for h in result.history)
