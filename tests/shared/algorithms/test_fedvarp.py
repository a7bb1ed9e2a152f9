"""FedVARP against numbers derived by hand and an independent loop-by-loop calculation."""
import pytest
import torch

from fl_services.shared.core.algorithms import registry
from fl_services.shared.core.algorithms.base import MODEL, ClientResult, Contribution
from fl_services.shared.core.algorithms.fedvarp import DELTAS, MEMORY, FedVARP
from fl_services.shared.core.config import RunConfig
from fl_services.shared.core.federation import participation
from fl_services.shared.core.records import check, decode_state, encode
from fl_services.shared.core.reference import run_reference
from fl_services.shared.core.tensors import InvalidContent
from tests.shared.algorithms.determinism import assert_reference_is_deterministic

SMALL = {"algorithm": "fedvarp", "model": {"name": "logreg"}, "data": {"dataset": "digits", "num_clients": 6},
         "local": {"lr": 0.1}}




def algo(num_clients: int = 4, server_lr: float = 1.0) -> FedVARP:
    return FedVARP(RunConfig(**{**SMALL, "data": {"dataset": "digits", "num_clients": num_clients}},
                             server_lr=server_lr))


def contribution(algorithm: FedVARP, deltas: dict[int, dict[str, torch.Tensor]]) -> Contribution:
    """What the edge submits for these clients' Δw (num_samples differ to show they do not weigh)."""
    results = [ClientResult(k, 10 * (k + 1), 0.0, {MODEL: d}) for k, d in deltas.items()]
    agg, _ = algorithm.edge_aggregate(results, {}, 0)
    return Contribution(0, 0, agg.tensors, agg.weight, tuple(participation(results)))


def w1(x: float) -> dict[str, torch.Tensor]:
    return {"w": torch.tensor([x])}


def test_cloud_update_by_hand_with_given_memory():
    # N = 4, y = [1, 2, 3, 4], S = {1, 3}, Δw_1 = 8, Δw_3 = 2, η_s = 2, w = 10:
    # v = ½[(8 − 2) + (2 − 4)] + ¼(1 + 2 + 3 + 4) = 2 + 2.5 = 4.5; w = 10 + 2·4.5 = 19; y = [1, 8, 3, 2].
    a = algo(server_lr=2.0)
    state = {MEMORY: {"w": torch.tensor([[1.0], [2.0], [3.0], [4.0]])}}
    buffer = [contribution(a, {3: w1(2.0), 1: w1(8.0)})]
    new, new_state = a.cloud_update({MODEL: {"w": torch.tensor([10.0])}}, buffer, state, 5)
    assert torch.equal(new[MODEL]["w"], torch.tensor([19.0]))
    assert new[MODEL]["w"].dtype == torch.float32
    assert set(new_state) == {MEMORY} and set(new_state[MEMORY]) == {"w"}
    assert torch.equal(new_state[MEMORY]["w"], torch.tensor([[1.0], [8.0], [3.0], [2.0]]))
    assert torch.equal(state[MEMORY]["w"], torch.tensor([[1.0], [2.0], [3.0], [4.0]]))  # the input is not mutated


def test_two_rounds_from_empty_memory_by_hand():
    a = algo()
    # Round 0, y = 0: S = {0, 2}, Δw = 1, 3: v = ½(1 + 3) + 0 = 2 (FedAvg with p_k = 1/m); w = 12; y = [1, 0, 3, 0].
    w, state = a.cloud_update({MODEL: {"w": torch.tensor([10.0])}}, [contribution(a, {0: w1(1.0), 2: w1(3.0)})], {}, 0)
    assert torch.equal(w[MODEL]["w"], torch.tensor([12.0]))
    assert torch.equal(state[MEMORY]["w"], torch.tensor([[1.0], [0.0], [3.0], [0.0]]))
    # Round 1: S = {0, 1}, Δw_0 = 5, Δw_1 = 2: v = ½[(5 − 1) + (2 − 0)] + ¼(1 + 0 + 3 + 0) = 3 + 1 = 4; w = 16.
    w, state = a.cloud_update(w, [contribution(a, {0: w1(5.0), 1: w1(2.0)})], state, 1)
    assert torch.equal(w[MODEL]["w"], torch.tensor([16.0]))
    assert torch.equal(state[MEMORY]["w"], torch.tensor([[5.0], [2.0], [3.0], [0.0]]))


def test_a_straggler_leaves_m_as_the_clients_that_answered():
    # λN = 2 were selected but only client 1 answered: m = 1. y = [1, 2, 3, 4], Δw_1 = 8:
    # v = (8 − 2) + 2.5 = 8.5; y_1 ← 8, the straggler's y unchanged.
    a = algo()
    state = {MEMORY: {"w": torch.tensor([[1.0], [2.0], [3.0], [4.0]])}}
    new, new_state = a.cloud_update({MODEL: {"w": torch.tensor([0.0])}}, [contribution(a, {1: w1(8.0)})], state, 0)
    assert torch.equal(new[MODEL]["w"], torch.tensor([8.5]))
    assert torch.equal(new_state[MEMORY]["w"], torch.tensor([[1.0], [8.0], [3.0], [4.0]]))


def test_cloud_update_matches_an_independent_loop_on_random_tensors():
    n, server_lr = 5, 0.7
    a = algo(num_clients=n, server_lr=server_lr)
    g = torch.Generator().manual_seed(0)
    global_ = {"weight": torch.randn(2, 3, generator=g), "bias": torch.randn(3, generator=g)}
    y = {k: {name: torch.randn(t.shape, generator=g) for name, t in global_.items()} for k in range(n)}
    selected = [4, 0, 2]
    deltas = {k: {name: torch.randn(t.shape, generator=g) for name, t in global_.items()} for k in selected}
    state = {MEMORY: {name: torch.stack([y[k][name] for k in range(n)]) for name in global_}}
    new, new_state = a.cloud_update({MODEL: global_}, [contribution(a, deltas)], state, 3)
    for name, w in global_.items():
        correction = sum(deltas[k][name].double() - y[k][name].double() for k in selected) / len(selected)
        average = sum(y[j][name].double() for j in range(n)) / n
        expected = (w.double() + server_lr * (correction + average)).float()
        assert torch.allclose(new[MODEL][name], expected, atol=1e-6), name
        for k in range(n):
            assert torch.equal(new_state[MEMORY][name][k], deltas[k][name] if k in selected else y[k][name])


def test_edge_aggregate_sends_each_clients_delta_and_the_spec_lists_exactly_those():
    a = algo()
    global_ = {MODEL: {"linear.weight": torch.zeros(2, 3), "linear.bias": torch.zeros(2)}}
    d = {k: {"linear.weight": torch.full((2, 3), float(k)), "linear.bias": torch.full((2,), -float(k))} for k in (3, 1)}
    agg, edge_state = a.edge_aggregate([ClientResult(k, 7, 0.5, {MODEL: d[k]}) for k in (3, 1)], {}, 0)
    assert edge_state == {}
    assert agg.weight == 2.0
    # One row per client, in id order: client 1, then client 3.
    assert a.contribution_spec(global_, [3, 1]) == {
        DELTAS: {"linear.weight": ((2, 2, 3), torch.float32), "linear.bias": ((2, 2), torch.float32)}}
    assert torch.equal(agg.tensors[DELTAS]["linear.weight"][1], torch.full((2, 3), 3.0))
    assert torch.equal(agg.tensors[DELTAS]["linear.bias"][0], torch.full((2,), -1.0))
    # What the edge sends passes the cloud's check after a safetensors round trip.
    check(decode_state(encode(agg.tensors)), a.contribution_spec(global_, [1, 3]))
    with pytest.raises(InvalidContent):
        check(agg.tensors, a.contribution_spec(global_, [1]))


@pytest.mark.parametrize("clients", [[1, 1], [4], [-1], []])
def test_contribution_spec_refuses_bad_client_lists(clients):
    with pytest.raises(InvalidContent):
        algo().contribution_spec({MODEL: {"w": torch.zeros(1)}}, clients)


def test_cloud_state_round_trips_safetensors():
    a = algo()
    _, state = a.cloud_update({MODEL: {"w": torch.zeros(2, 2)}},
                              [contribution(a, {0: {"w": torch.ones(2, 2)}, 3: {"w": torch.ones(2, 2)}})], {}, 0)
    assert {k: (tuple(v.shape), v.dtype) for k, v in state[MEMORY].items()} == {"w": ((4, 2, 2), torch.float32)}
    back = decode_state(encode(state))
    assert torch.equal(back[MEMORY]["w"], state[MEMORY]["w"])


def test_refuses_multi_edge_and_edge_round_configs():
    with pytest.raises(ValueError, match="fedvarp keeps global server memory and runs with one edge only"):
        registry.check(RunConfig(**SMALL, topology={"num_edges": 2, "buffer_size": 2}))
    with pytest.raises(ValueError, match="edge_rounds"):
        registry.check(RunConfig(**SMALL, topology={"edge_rounds": 2}))


def test_reference_is_deterministic_with_partial_participation_and_two_epochs():
    config = RunConfig(**{**SMALL, "local": {"lr": 0.1, "epochs": 2}}, rounds=3, fraction=0.5)
    assert_reference_is_deterministic(config, participants=3, min_accuracy=0.8)


def test_first_round_is_uniform_fedavg_and_later_rounds_are_not():
    """With y = 0, v is the plain mean of the Δw_k: FedAvg with p_k = 1/m. From round 1 on the memory counts."""
    config = RunConfig(**{**SMALL, "local": {"lr": 0.1, "epochs": 2}}, fraction=0.5, weighting="uniform")
    fedavg = config.model_copy(update={"algorithm": "fedavg"})
    one_varp, one_avg = run_reference(config, rounds=1), run_reference(fedavg, rounds=1)
    for name in one_avg.global_state:
        assert torch.allclose(one_varp.global_state[name], one_avg.global_state[name], atol=1e-6), name
    two_varp, two_avg = run_reference(config, rounds=2), run_reference(fedavg, rounds=2)
    assert any(not torch.allclose(two_varp.global_state[n], two_avg.global_state[n], atol=1e-4)
               for n in two_avg.global_state)
