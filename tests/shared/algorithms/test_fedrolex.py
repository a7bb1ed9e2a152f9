"""FedRolex against numbers derived by hand, plus the equivalences the issue promises."""
import pytest
import torch

from fl_services.shared.core.algorithms import registry
from fl_services.shared.core.algorithms.base import MODEL, ClientResult, Contribution
from fl_services.shared.core.algorithms.fedrolex import COVERAGE, FedRolex, coverage_reduce
from fl_services.shared.core.algorithms.submodel import ARCHITECTURES, embed
from fl_services.shared.core.config import ModelConfig, RunConfig
from fl_services.shared.core.data import load_federated
from fl_services.shared.core.federation import initial_model, local_job
from fl_services.shared.core.models import build_model
from fl_services.shared.core.records import decode_state, encode, spec_of
from fl_services.shared.core.reference import run_reference
from fl_services.shared.core.tensors import InvalidContent

SMALL = {"algorithm": "fedrolex", "model": {"name": "mlp"}, "data": {"dataset": "digits", "num_clients": 6},
         "local": {"lr": 0.1, "epochs": 2}}
MLP = ARCHITECTURES["mlp"]
# A tiny mlp: 1 input, fc1 with 4 units, fc2 with 2 units, 1 output.
TINY = {"fc1.weight": (4, 1), "fc1.bias": (4,), "fc2.weight": (2, 4), "fc2.bias": (2,), "fc3.weight": (1, 2),
        "fc3.bias": (1,)}


def test_default_capacities_and_config_checks():
    algo = FedRolex(RunConfig(**SMALL))
    assert [algo.capacity(k) for k in range(6)] == [1.0, 0.5, 0.25, 1.0, 0.5, 0.25]
    assert FedRolex(RunConfig(**SMALL, params={"capacities": [0.3] * 6})).capacity(4) == 0.3
    with pytest.raises(ValueError, match="3 entries for 6 clients"):
        registry.check(RunConfig(**SMALL, params={"capacities": [1.0, 0.5, 0.25]}))
    with pytest.raises(ValueError):
        registry.check(RunConfig(**SMALL, params={"capacities": [0.0] * 6}))
    with pytest.raises(ValueError, match="server_lr must be 1"):
        registry.check(RunConfig(**SMALL, server_lr=2.0))


def test_per_coordinate_aggregation_by_hand():
    """Two clients in round 1, weights p_A = 1 and p_B = 3, on TINY.

    A (β = ½): fc1 ⌊2⌋ = 2 units from 1 → {1, 2}; fc2 ⌊1⌋ = 1 unit from 1 → {1}.
    B (β = ¾): fc1 ⌊3⌋ = 3 units from 1 → {1, 2, 3}; fc2 ⌊1.5⌋ = 1 unit → {1}.
    fc1.bias, Δ_A = [2, 4] at {1, 2}, Δ_B = [4, 8, 12] at {1, 2, 3}:
        unit 0: nobody → stays 1;  unit 1: (1·2 + 3·4)/4 = 3.5;  unit 2: (1·4 + 3·8)/4 = 7;  unit 3: 3·12/3 = 12.
    fc3.weight [1, 2], both cover column 1 only: Δ_A = [[1]], Δ_B = [[5]] → (1 + 15)/4 = 4; column 0 stays.
    """
    algo = FedRolex(RunConfig(**SMALL, params={"capacities": [1.0, 0.5, 0.75, 1.0, 1.0, 1.0]}))
    algo.full_shapes = TINY  # the run's model is digits-sized; the maths is the same on a tiny one
    a = {"fc1.bias": torch.tensor([2.0, 4.0]), "fc3.weight": torch.tensor([[1.0]])}
    b = {"fc1.bias": torch.tensor([4.0, 8.0, 12.0]), "fc3.weight": torch.tensor([[5.0]])}
    # Each client through its own edge: the cloud's combination must equal the flat rule.
    edges = [algo.edge_aggregate([ClientResult(k, n, 0.0, {MODEL: t})], {}, 1)[0] for k, n, t in ((1, 1, a), (2, 3, b))]
    assert torch.equal(edges[1].tensors[COVERAGE]["fc1.bias"], torch.tensor([0.0, 3.0, 3.0, 3.0], dtype=torch.float64))
    assert torch.equal(edges[1].tensors[MODEL]["fc1.bias"], torch.tensor([0.0, 12.0, 24.0, 36.0], dtype=torch.float64))
    contributions = [Contribution(e, 0, agg.tensors, agg.weight, (k,))
                     for e, (k, agg) in enumerate(zip((1, 2), edges, strict=True))]
    global_ = {MODEL: {"fc1.bias": torch.ones(4), "fc3.weight": torch.ones(1, 2)}}
    new, state = algo.cloud_update(global_, contributions, {}, 1)
    assert torch.equal(new[MODEL]["fc1.bias"], torch.tensor([1.0, 4.5, 8.0, 13.0]))
    assert torch.equal(new[MODEL]["fc3.weight"], torch.tensor([[1.0, 5.0]]))
    assert state == {}


def test_coverage_reduce_sums_weights_per_coordinate():
    windows = {"fc1": torch.tensor([0, 3]), "fc2": torch.tensor([0, 1])}
    placed, masks = embed({"fc1.bias": torch.tensor([1.0, 1.0])}, MLP, windows, TINY)
    partial = coverage_reduce([(2.0, placed, masks), (0.5, placed, masks)])
    assert partial.weight == 2.5
    assert torch.equal(partial.sums[COVERAGE]["fc1.bias"], torch.tensor([2.5, 0.0, 0.0, 2.5], dtype=torch.float64))
    assert torch.equal(partial.sums[MODEL]["fc1.bias"], torch.tensor([2.5, 0.0, 0.0, 2.5], dtype=torch.float64))


def test_edge_aggregate_on_the_run_model_counts_coverage():
    """digits mlp (fc1, fc2: 200 units), round 0, default capacities, uniform weights, Δ = 1 everywhere:
    client 0 (β = 1) covers fc1 units 0..199, client 1 (β = ½) 0..99, client 2 (β = ¼) 0..49."""
    algo = FedRolex(RunConfig(**SMALL, weighting="uniform"))
    global_ = algo.init_global(initial_model(algo.config))
    results = [ClientResult(k, 10, 0.0, {MODEL: {n: torch.ones_like(t)
                                                 for n, t in algo.client_task(global_, k, 0)[MODEL].items()}})
               for k in (2, 0, 1)]
    aggregate, _ = algo.edge_aggregate(results, {}, 0)
    expected = torch.tensor([3.0] * 50 + [2.0] * 50 + [1.0] * 100, dtype=torch.float64)
    coverage = aggregate.tensors[COVERAGE]
    assert torch.equal(coverage["fc1.bias"], expected)
    assert torch.equal(aggregate.tensors[MODEL]["fc1.bias"], expected)
    assert coverage["fc2.weight"][40, 40] == 3 and coverage["fc2.weight"][40, 60] == 2
    assert coverage["fc2.weight"][150, 40] == 1 and coverage["fc3.weight"][9, 99] == 2
    assert aggregate.weight == 3.0
    assert spec_of(aggregate.tensors) == algo.contribution_spec(global_, [0, 1, 2])
    back = decode_state(encode(aggregate.tensors))
    assert torch.equal(back[MODEL]["fc2.weight"], aggregate.tensors[MODEL]["fc2.weight"])


@pytest.mark.parametrize("case", ["tiny-coordinate-weight", "weight-beyond-the-total", "negative-weight",
                                  "sum-where-nobody-covered"])
def test_check_contribution_bounds_every_coordinate(case):
    """The contribution's total weight checks out, yet one coordinate's weight could still blow its mean up."""
    algo = FedRolex(RunConfig(**SMALL, weighting="uniform"))
    global_ = algo.init_global(initial_model(algo.config))
    results = [ClientResult(k, 10, 0.0, {MODEL: {n: torch.ones_like(t)
                                                 for n, t in algo.client_task(global_, k, 0)[MODEL].items()}})
               for k in (2, 0, 1)]
    good, _ = algo.edge_aggregate(results, {}, 0)
    sent = algo.to_wire(good.tensors)  # as it travels: float32 sums and coordinate weights
    algo.check_contribution(global_, [0, 1, 2], sent, good.weight)
    tensors = {group: dict(members) for group, members in sent.items()}
    bias, weight = tensors[MODEL]["fc1.bias"].clone(), tensors[COVERAGE]["fc1.bias"].clone()
    if case == "tiny-coordinate-weight":
        weight[0], fragment = 1e-30, "values beyond"
    elif case == "weight-beyond-the-total":
        weight[0], bias[0], fragment = 4.0, 4.0, "must lie in [0, 3]"
    elif case == "negative-weight":
        weight[0], fragment = -1.0, "must lie in [0, 3]"
    else:
        bias[199], fragment = 1.0, "values beyond"
        weight[199] = 0.0
    tensors[MODEL]["fc1.bias"], tensors[COVERAGE]["fc1.bias"] = bias, weight
    with pytest.raises(InvalidContent, match=fragment.replace("[", r"\[")):
        algo.check_contribution(global_, [0, 1, 2], tensors, good.weight)


def test_client_trains_the_window_only():
    """Client 1 (β = ½) in round 7: fc1 rows 7..106, fc2 the same 100 units, whole input and output."""
    config = RunConfig(**SMALL)
    algo = FedRolex(config)
    global_ = algo.init_global(initial_model(algo.config))
    task = algo.client_task(global_, 1, 7)
    assert spec_of(task) == {MODEL: {
        "fc1.weight": ((100, 64), torch.float32), "fc1.bias": ((100,), torch.float32),
        "fc2.weight": ((100, 100), torch.float32), "fc2.bias": ((100,), torch.float32),
        "fc3.weight": ((10, 100), torch.float32), "fc3.bias": ((10,), torch.float32)}}
    assert torch.equal(task[MODEL]["fc1.bias"], global_[MODEL]["fc1.bias"][7:107])
    assert torch.equal(task[MODEL]["fc2.weight"], global_[MODEL]["fc2.weight"][7:107, 7:107])
    job = local_job(config, 1, 7, load_federated(config.data, config.seed).clients[1])
    update = algo.local_update(job, task, {})
    assert spec_of(update.tensors) == algo.result_spec(task)
    assert update.tensors[MODEL]["fc1.weight"].abs().sum() > 0 and update.state == {}
    assert torch.equal(decode_state(encode(task))[MODEL]["fc2.weight"], task[MODEL]["fc2.weight"])


def test_full_capacity_is_fedavg_exactly():
    config = RunConfig(**SMALL, rounds=2, fraction=0.5, params={"capacities": [1.0] * 6})
    rolex = run_reference(config)
    fedavg = run_reference(config.model_copy(update={"algorithm": "fedavg", "params": {}}))
    for name, t in fedavg.global_state.items():
        assert torch.equal(rolex.global_state[name], t)


def test_reference_is_deterministic_and_moves_every_window():
    config = RunConfig(**SMALL, rounds=2, fraction=0.5)
    a, b = run_reference(config), run_reference(config)
    for name in a.global_state:
        assert torch.equal(a.global_state[name], b.global_state[name])
    assert [[c.client_id for c in h.clients] for h in a.history] ==\
        [[c.client_id for c in h.clients] for h in b.history]
    assert all(len(h.clients) == 3 for h in a.history)


def test_logreg_is_fedavg():
    config = RunConfig(**{**SMALL, "model": {"name": "logreg"}}, rounds=2, fraction=0.5)
    rolex = run_reference(config)
    fedavg = run_reference(config.model_copy(update={"algorithm": "fedavg"}))
    assert all(torch.equal(rolex.global_state[n], t) for n, t in fedavg.global_state.items())


def test_two_edges_equal_one_edge_when_everyone_participates():
    flat = run_reference(RunConfig(**SMALL, rounds=2))
    hier = run_reference(RunConfig(**SMALL, rounds=2, topology={"num_edges": 2, "buffer_size": 2}))
    for name in flat.global_state:
        assert torch.allclose(flat.global_state[name], hier.global_state[name], atol=1e-6)


def test_an_edge_needs_no_data_set():
    """The edge learns the full shapes from the global state it cuts tasks from, not from the data."""
    config = RunConfig(**{**SMALL, "data": {"dataset": "npz", "path": "/nonexistent/edge-has-no-data.npz",
                                            "num_clients": 6}})
    algo = FedRolex(config)
    model = build_model(ModelConfig(name="mlp"), (64,), 10)
    global_ = algo.init_global(model)
    results = [ClientResult(k, 5, 0.0, algo.client_task(global_, k, 3)) for k in range(3)]
    aggregate, _ = algo.edge_aggregate(results, {}, 3)
    assert spec_of(aggregate.tensors) == algo.contribution_spec(global_, [0, 1, 2])
