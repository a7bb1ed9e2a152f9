"""FedSCAVAR against numbers derived by hand and an independent plain-tensor computation."""
from functools import partial

import pytest
import torch
import torch.nn.functional as F

from fl_services.shared.core.algorithms import registry
from fl_services.shared.core.algorithms.base import MODEL, ClientResult, Contribution, LocalJob
from fl_services.shared.core.algorithms.control import CONTROL
from fl_services.shared.core.algorithms.fedscavar import FedSCAVAR
from fl_services.shared.core.algorithms.fedvarp import DELTAS, MEMORY, updated_memory, varp_direction
from fl_services.shared.core.config import ModelConfig, RunConfig
from fl_services.shared.core.data import ArrayDataset, ClientData
from fl_services.shared.core.federation import participation
from fl_services.shared.core.models import build_model
from fl_services.shared.core.records import decode_state, encode, spec_of
from fl_services.shared.core.reference import run_reference

SMALL = {"algorithm": "fedscavar", "model": {"name": "mlp"}, "data": {"dataset": "digits", "num_clients": 6},
         "local": {"lr": 0.1, "epochs": 2}}
# A tiny mlp: fc1 with 4 units, fc2 with 2 units.
TINY = {"fc1.weight": (4, 2), "fc1.bias": (4,), "fc2.weight": (2, 4), "fc2.bias": (2,), "fc3.weight": (2, 2),
        "fc3.bias": (2,)}


def _values(seed: int, scale: float = 1.0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {n: scale * torch.randn(s, generator=g) for n, s in TINY.items()}


def test_local_update_against_plain_tensors():
    """Client 1 (β = ½) in round 1: fc1 ⌊2⌋ = 2 units from 1 → {1, 2}; fc2 ⌊1⌋ = 1 unit from 1 → {1}.
    E = 2 full-batch steps (|𝓑| = 1), η = 0.1, μ = 0.5, with non-zero c and c_k."""
    mu, lr = 0.5, 0.1
    config = RunConfig(**{**SMALL, "local": {"lr": lr, "epochs": 2, "batch_size": 0}},
                       params={"mu": mu, "capacities": [1.0, 0.5, 1.0, 1.0, 1.0, 1.0]})
    algo = FedSCAVAR(config)
    algo.full_shapes = TINY
    w, c, c_k = _values(0), _values(1, 0.1), _values(2, 0.1)
    global_ = {MODEL: w, CONTROL: c}
    task = algo.client_task(global_, 1, 1)
    data = ArrayDataset(torch.tensor([[1.0, -1.0], [0.5, 2.0], [-1.5, 0.5]]), torch.tensor([0, 1, 1]))
    factory = partial(build_model, ModelConfig(name="mlp"), (2,), 2, hidden1=4, hidden2=2)
    job = LocalJob(1, 1, ClientData(data, data), factory, torch.Generator().manual_seed(0))
    update = algo.local_update(job, task, {CONTROL: c_k})

    # The window by hand, as slices.
    at = {"fc1.weight": (slice(1, 3),), "fc1.bias": (slice(1, 3),), "fc2.weight": (slice(1, 2), slice(1, 3)),
          "fc2.bias": (slice(1, 2),), "fc3.weight": (slice(None), slice(1, 2)), "fc3.bias": (slice(None),)}
    w0 = {n: w[n][at[n]] for n in TINY}
    cs, cks = {n: c[n][at[n]] for n in TINY}, {n: c_k[n][at[n]] for n in TINY}
    p = {n: t.clone().requires_grad_() for n, t in w0.items()}
    losses = []
    for _ in range(2):
        h = F.relu(data.x @ p["fc1.weight"].T + p["fc1.bias"])
        h = F.relu(h @ p["fc2.weight"].T + p["fc2.bias"])
        loss = F.cross_entropy(h @ p["fc3.weight"].T + p["fc3.bias"], data.y)
        losses.append(loss.item())
        prox = 0.5 * mu * sum(((p[n] - w0[n]) ** 2).sum() for n in p)
        grads = torch.autograd.grad(loss + prox, [p[n] for n in TINY])
        with torch.no_grad():
            p = {n: (p[n] - lr * (g - cks[n] + cs[n])).requires_grad_() for n, g in zip(TINY, grads, strict=True)}
    for n in TINY:
        c_plus = cks[n] - cs[n] + (w0[n] - p[n].detach()) / (2 * lr)
        assert torch.allclose(task[MODEL][n], w0[n]) and torch.allclose(task[CONTROL][n], cs[n])
        assert torch.allclose(update.tensors[MODEL][n], p[n].detach() - w0[n], atol=1e-6), n
        assert torch.allclose(update.tensors[CONTROL][n], c_plus - cks[n], atol=1e-5), n
        kept = c_k[n].clone()
        kept[at[n]] = c_plus
        assert torch.allclose(update.state[CONTROL][n], kept, atol=1e-5), n  # outside the window: c_k
    assert update.loss == pytest.approx(sum(losses) / 2, rel=1e-6)
    assert spec_of(update.tensors) == algo.result_spec(task)
    assert spec_of(update.state) == {CONTROL: {n: (s, torch.float32) for n, s in TINY.items()}}


def test_cloud_step_by_hand():
    """N = 4, clusters [0, 0, 1, 1], round 1, clients 1 (β = ½, 1 sample) and 2 (β = ¾, 3 samples), η_s = 2.

    fc1 (K = 4): client 1 covers {1, 2}, client 2 covers {1, 2, 3}. Memory y_0 = 1, y_1 = 2 on fc1.bias.
    Δ_1 = [3, 5] at {1, 2}, Δ_2 = [4, 6, 8] at {1, 2, 3}:
        (1/m) Σ M_k(Δ_k − y_{c_k}) = ½([0, 2, 4, 0] + [0, 2, 4, 6]) = [0, 2, 4, 3]
        (1/N) Σ_j y_{c_j} = (2·1 + 2·2)/4 = 1.5  →  v = [1.5, 3.5, 5.5, 4.5],  w = 0 + 2v = [3, 7, 11, 9]
        y_0 ← [1, 3, 5, 1] (client 1 where it covers),  y_1 ← [2, 4, 6, 8].
    fc3.bias (the output, always covered), y = 0: Δ_1 = [1, 1], Δ_2 = [3, 3] → v = 2, w = 4; y_0 = 1, y_1 = 3.
    Controls, p = [¼, ¾], Δc_1 = [1, 1] at {1, 2}, Δc_2 = [2, 2, 2] at {1, 2, 3} on fc1.bias:
        Σ p Δc = [0, 1.75, 1.75, 1.5],  c = 0 + (m/N)·that = [0, 0.875, 0.875, 0.75]  (no η_s).
    """
    config = RunConfig(**{**SMALL, "data": {"dataset": "digits", "num_clients": 4}}, server_lr=2.0,
                       params={"capacities": [1.0, 0.5, 0.75, 0.25], "clusters": [0, 0, 1, 1]})
    algo = FedSCAVAR(config)
    algo.full_shapes = TINY
    zeros = {n: torch.zeros(s) for n, s in TINY.items()}
    global_ = {MODEL: zeros, CONTROL: dict(zeros)}
    values = {1: ([3.0, 5.0], [1.0, 1.0], [1.0, 1.0]), 2: ([4.0, 6.0, 8.0], [3.0, 3.0], [2.0, 2.0, 2.0])}
    results = []
    for k, n in ((2, 3), (1, 1)):
        tensors = {g: {name: torch.zeros_like(t) for name, t in ts.items()}
                   for g, ts in algo.client_task(global_, k, 1).items()}
        tensors[MODEL]["fc1.bias"], tensors[MODEL]["fc3.bias"] = torch.tensor(values[k][0]), torch.tensor(values[k][1])
        tensors[CONTROL]["fc1.bias"] = torch.tensor(values[k][2])
        results.append(ClientResult(k, n, 0.0, tensors))
    aggregate, _ = algo.edge_aggregate(results, {}, 1)
    assert spec_of(aggregate.tensors) == algo.contribution_spec(global_, [1, 2])
    assert torch.equal(aggregate.tensors[DELTAS]["fc1.bias"][1], torch.tensor([0.0, 4.0, 6.0, 8.0]))  # client 2
    blob = decode_state(encode(aggregate.tensors))
    memory = {MEMORY: {"fc1.bias": torch.tensor([[1.0] * 4, [2.0] * 4], dtype=torch.float64)}}
    contribution = Contribution(0, 1, blob, aggregate.weight, tuple(participation(results)))
    new, state = algo.cloud_update(global_, [contribution], memory, 1)
    assert torch.allclose(new[MODEL]["fc1.bias"], torch.tensor([3.0, 7.0, 11.0, 9.0]))
    assert torch.allclose(new[MODEL]["fc3.bias"], torch.tensor([4.0, 4.0]))
    assert torch.allclose(new[CONTROL]["fc1.bias"], torch.tensor([0.0, 0.875, 0.875, 0.75]))
    assert torch.equal(new[MODEL]["fc1.weight"], torch.zeros(4, 2))
    assert torch.equal(new[CONTROL]["fc3.bias"], torch.zeros(2))
    want = torch.tensor([[1.0, 3.0, 5.0, 1.0], [2.0, 4.0, 6.0, 8.0]], dtype=torch.float64)
    assert torch.equal(state[MEMORY]["fc1.bias"], want)
    assert torch.equal(state[MEMORY]["fc3.bias"], torch.tensor([[1.0, 1.0], [3.0, 3.0]], dtype=torch.float64))
    assert all(t.dtype == torch.float64 and t.shape[0] == 2 for t in state[MEMORY].values())
    assert algo.model_parameters(new).keys() == TINY.keys()


def test_full_masks_give_the_unmasked_varp_maths():
    """FedVARP's rule is the masked one with every mask 1: v = (1/m) Σ (Δ_i − y_{g_i}) + (1/N) Σ_g |g| y_g and
    y_g ← the mean of its clients' Δ_i, by plain tensor arithmetic."""
    g = torch.Generator().manual_seed(0)
    deltas, memory = torch.randn(3, 5, generator=g), torch.randn(2, 5, generator=g, dtype=torch.float64)
    rows, sizes, ones = torch.tensor([0, 1, 1]), torch.tensor([4, 2]), torch.ones(3, 5, dtype=torch.bool)
    d = deltas.to(torch.float64)
    by_hand = ((d[0] - memory[0]) + (d[1] - memory[1]) + (d[2] - memory[1])) / 3 + (4 * memory[0] + 2 * memory[1]) / 6
    assert torch.allclose(varp_direction(deltas, ones, memory, rows, sizes, 6), by_hand)
    want = torch.stack([d[0], (d[1] + d[2]) / 2])
    assert torch.allclose(updated_memory(memory, deltas, ones, rows), want)


def test_full_capacity_one_cluster_no_prox_is_scaffold():
    """With every β = 1 and one cluster, v = mean Δw (the memory cancels) and FedSCAVAR is SCAFFOLD."""
    base = {**SMALL, "rounds": 3, "fraction": 0.5, "weighting": "uniform"}
    scavar = run_reference(RunConfig(**base, params={"mu": 0, "capacities": [1.0] * 6, "clusters": [0] * 6}))
    scaffold = run_reference(RunConfig(**{**base, "algorithm": "scaffold"}))
    assert scavar.global_record.keys() == scaffold.global_record.keys() == {MODEL, CONTROL}
    for name, t in scaffold.global_state.items():
        assert torch.allclose(scavar.global_state[name], t, atol=1e-5), name


def test_reference_run_is_deterministic_and_keeps_full_size_controls():
    config = RunConfig(**SMALL, rounds=2, fraction=0.5, params={"num_clusters": 2})
    a, b = run_reference(config), run_reference(config)
    for name in a.global_state:
        assert torch.equal(a.global_state[name], b.global_state[name])
    assert all(len(h.clients) == 3 for h in a.history)
    for k, state in a.client_states.items():
        assert spec_of(state) == {CONTROL: {n: (tuple(t.shape), torch.float32) for n, t in a.global_state.items()}}, k
    assert a.history[-1].test_accuracy > 0.3


def test_config_checks():
    with pytest.raises(ValueError, match="one edge"):
        registry.check(RunConfig(**SMALL, topology={"num_edges": 2, "buffer_size": 2}))
    with pytest.raises(ValueError, match="clusters"):
        registry.check(RunConfig(**SMALL, params={"clusters": [0, 1]}))
    with pytest.raises(ValueError, match="capacities"):
        registry.check(RunConfig(**SMALL, params={"capacities": [1.0]}))
    registry.check(RunConfig(**SMALL, server_lr=0.5,
                             params={"mu": 0.1, "capacities": [0.5] * 6, "clusters": [0, 0, 1, 1, 2, 5]}))
