"""HFPL's hooks: the client's prototypes and regulariser, the edge's and cloud's incremental means, the
checks on what crosses the wire, and the reference runner's determinism with stale edges."""
import math

import pytest
import torch
from torch import nn

from fl_services.shared.core.algorithms import registry
from fl_services.shared.core.algorithms.base import ClientResult, Contribution
from fl_services.shared.core.algorithms.hfpl import (
    COUNTS,
    EDGES,
    EVALUATION,
    EXTRACTOR,
    FEATURES,
    HEAD,
    HFPL,
    LABELS,
    MEANS,
    PROTOTYPES,
    SAMPLE,
    WEIGHT,
    EdgeMemory,
)
from fl_services.shared.core.config import RunConfig
from fl_services.shared.core.data import load_federated
from fl_services.shared.core.federation import initial_model, local_job
from fl_services.shared.core.records import flatten, spec_of, unpack
from fl_services.shared.core.reference import run_reference, schedule_of
from fl_services.shared.core.reports import ClientParticipation
from fl_services.shared.core.seeding import (
    CLASSIFIER,
    MODEL_INIT,
    derive_seed,
    seeded_default_generator,
    torch_generator,
)
from fl_services.shared.core.tensors import InvalidContent
from fl_services.shared.core.training import Evaluation, batches

F64, F32, I64 = torch.float64, torch.float32, torch.int64
SMALL = dict(algorithm="hfpl", rounds=3, seed=0,
             data=dict(dataset="digits", partition="dirichlet", alpha=0.3, num_clients=6),
             local=dict(epochs=1, lr=0.05, batch_size=32), topology=dict(num_edges=3, buffer_size=2),
             params=dict(proto_weight=0.05))
# Client 2 of SMALL: an mlp (2 // L = 0 → families[0]), 132 training samples, classes 2 and 3 absent.
CLIENT = 2


def config(local: dict | None = None, **params) -> RunConfig:
    return RunConfig.model_validate({**SMALL, "local": {**SMALL["local"], **(local or {})},
                                     "params": {**SMALL["params"], **params}})


def hfpl(local: dict | None = None, **params) -> HFPL:
    return HFPL(config(local, **params))


def train_data(a: HFPL):
    return load_federated(a.config.data, a.config.seed).clients[CLIENT]


def update(a: HFPL, task, state=None):
    job = local_job(a.config, CLIENT, 0, train_data(a))
    return a.local_update(job, task, state or {})


def task_of(a: HFPL, prototypes: torch.Tensor | None = None, counts: torch.Tensor | None = None):
    task = a.init_global(initial_model(a.config))
    if prototypes is not None:
        task = {**task, PROTOTYPES: {MEANS: prototypes, COUNTS: counts}}
    return task


def features(a: HFPL, state, x: torch.Tensor) -> torch.Tensor:
    """f_i(x) recomputed by a fresh extractor of client i's family loaded with its returned state."""
    f = a.feature_extractor(CLIENT, tuple(x.shape[1:]))
    f.load_state_dict(state[EXTRACTOR])
    f.eval()
    with torch.no_grad():
        return f(x)


# ---- client ---------------------------------------------------------------------------------------

def test_local_update_sends_class_means_of_its_own_features_and_a_capped_sample():
    a = hfpl(feature_cap=20)
    task = task_of(a)
    u = update(a, task)
    assert spec_of(u.tensors) == {PROTOTYPES: {MEANS: ((10, 64), F64), COUNTS: ((10,), I64)},
                                  SAMPLE: {FEATURES: ((20, 64), F32), LABELS: ((20,), I64)}}
    a.check_result(task, u.tensors)
    train = train_data(a).train
    assert u.num_samples == len(train) == 132
    counts = torch.bincount(train.y, minlength=10)
    assert torch.equal(u.tensors[PROTOTYPES][COUNTS], counts)
    z = features(a, u.state, train.x)
    for j in counts.nonzero().flatten().tolist():
        torch.testing.assert_close(u.tensors[PROTOTYPES][MEANS][j], z[train.y == j].double().mean(0), rtol=0, atol=1e-9)
    # Every sent row is f_i(x) of a distinct training sample, sent with that sample's label.
    match = (u.tensors[SAMPLE][FEATURES][:, None, :] == z[None]).all(-1)  # (20, 132)
    rows = match.float().argmax(1)
    assert match.any(1).all() and len(set(rows.tolist())) == 20
    assert torch.equal(u.tensors[SAMPLE][LABELS], train.y[rows])


def test_the_state_is_the_extractor_and_the_next_call_starts_from_it():
    # lr = 1e-30 moves no float32 weight: the returned extractor is exactly the one training began with.
    a = hfpl(local={"lr": 1e-30})
    task = task_of(a)
    first = update(a, task)
    fresh = a.feature_extractor(CLIENT, (1, 8, 8)).state_dict()
    assert set(first.state) == {EXTRACTOR} and set(first.state[EXTRACTOR]) == set(fresh)
    assert all(torch.equal(first.state[EXTRACTOR][k], v) for k, v in fresh.items())
    moved = {EXTRACTOR: {k: v + 1.0 for k, v in first.state[EXTRACTOR].items()}}
    second = update(a, task, moved)
    assert all(torch.equal(second.state[EXTRACTOR][k], v) for k, v in moved[EXTRACTOR].items())


def test_the_regulariser_pulls_features_towards_the_global_prototype():
    # Every class's C̄_y at 3·e_0; λ_p = 0.5 (1.0 already overshoots at lr 0.05). Same seed, same batches.
    a0, a1 = hfpl(proto_weight=0.0), hfpl(proto_weight=0.5)
    centre = torch.zeros(10, 64, dtype=F64)
    centre[:, 0] = 3.0
    counts = torch.ones(10, dtype=F64)
    train = train_data(a0).train

    def distance(a: HFPL) -> float:
        u = update(a, task_of(a, centre, counts))
        return float((features(a, u.state, train.x).double() - centre[train.y]).norm(dim=1).mean())

    # Measured: ≈ 3.25 without the pull, ≈ 0.65 with it.
    assert distance(a1) < distance(a0) / 2


@pytest.mark.parametrize("which", ["none", "only classes the client lacks"])
def test_classes_without_a_global_prototype_are_not_pulled(which):
    train = train_data(hfpl()).train
    counts = torch.zeros(10, dtype=F64)
    if which != "none":
        lacks = torch.bincount(train.y, minlength=10) == 0
        assert lacks.any()
        counts[lacks] = 3.0
    prototypes = torch.full((10, 64), 50.0, dtype=F64)
    plain, pulled = hfpl(proto_weight=0.0), hfpl(proto_weight=1e6)
    u0, u1 = update(plain, task_of(plain, prototypes, counts)), update(pulled, task_of(pulled, prototypes, counts))
    assert same(flatten(u0.state), flatten(u1.state))
    assert same(flatten(u0.tensors), flatten(u1.tensors))
    assert u0.loss == u1.loss


# ---- families and configs -------------------------------------------------------------------------

@pytest.mark.parametrize("num_clients, per_edge", [(9, ["mlp", "cnn", "cnn_deep"]), (6, ["mlp", "cnn"])])
def test_default_families_mix_within_every_edge(num_clients, per_edge):
    # Edge l serves l, l + L, l + 2L, ...: the families taken in turn over k // L.
    c = RunConfig.model_validate({**SMALL, "data": {**SMALL["data"], "num_clients": num_clients}})
    a = HFPL(c)
    for edge in range(3):
        assert [a.family_of(k) for k in c.clients_of_edge(edge)] == per_edge


def test_client_families_are_honoured_and_build_their_architecture():
    chosen = ["cnn_deep", "mlp", "mlp", "cnn", "cnn_deep", "cnn"]
    a = hfpl(client_families=chosen, feature_dim=7)
    convs = {"mlp": 0, "cnn": 2, "cnn_deep": 3}
    for k, family in enumerate(chosen):
        assert a.family_of(k) == family
        f = a.feature_extractor(k, (1, 8, 8))
        assert sum(isinstance(m, nn.Conv2d) for m in f.modules()) == convs[family]
        assert f(torch.zeros(2, 1, 8, 8)).shape == (2, 7)


@pytest.mark.parametrize("change, message", [
    ({"model": {"name": "mlp"}, "data": {"dataset": "synthetic", "num_clients": 6}}, "need images"),
    ({"model": {"name": "mlp"}, "data": {"dataset": "mnist1d", "num_clients": 6},
      "params": {"families": ["mlp"], "client_families": ["mlp"] * 5 + ["cnn_deep"]}}, "need images"),
    ({"params": {"families": ["mlp", "resnet"]}}, "unknown feature families"),
    ({"params": {"client_families": ["mlp"] * 5}}, "client_families names 5 families for 6 clients"),
    ({"topology": {"num_edges": 3, "buffer_size": 4}}, "cannot exceed"),
])
def test_check_config_refuses(change, message):
    with pytest.raises(ValueError, match=message):
        registry.parse_config({**SMALL, **change})


def test_check_config_accepts_mlp_only_on_flat_data():
    # The run's model only tells J; on 1-D data it must fit them too, as for every algorithm.
    RunConfig.model_validate({**SMALL, "data": {"dataset": "synthetic", "num_clients": 6},
                              "model": {"name": "mlp"}, "params": {"families": ["mlp"]}})


# ---- edge -----------------------------------------------------------------------------------------

def result(k: int, prototypes, counts, rows, labels) -> ClientResult:
    return ClientResult(k, 10, 0.0, {
        PROTOTYPES: {MEANS: torch.tensor(prototypes, dtype=F64), COUNTS: torch.tensor(counts)},
        SAMPLE: {FEATURES: torch.tensor(rows, dtype=F32), LABELS: torch.tensor(labels)}})


def rows_of(triple) -> list:
    return sorted(zip(triple[SAMPLE][FEATURES].tolist(), triple[SAMPLE][LABELS].tolist(), strict=True))


def test_edge_aggregate_over_two_rounds_keeps_the_latest_of_every_client():
    a = hfpl(feature_dim=2, feature_cap=4)
    # J = 3, d = 2. Round 0: clients 0 and 3. C_0 = ([1,1] + [3,3])/2 = [2,2], C_1 = [2,2], C_2 = [6,6].
    agg, state = a.edge_aggregate([
        result(3, [[3, 3], [0, 0], [6, 6]], [2, 0, 5], [[30, 0], [31, 0], [32, 0]], [0, 2, 2]),
        result(0, [[1, 1], [2, 2], [0, 0]], [3, 1, 0], [[0, 0], [1, 0]], [0, 1]),
    ], {}, 0)
    assert torch.equal(agg.tensors[PROTOTYPES][MEANS], torch.tensor([[2.0, 2], [2, 2], [6, 6]], dtype=F64))
    assert torch.equal(agg.tensors[PROTOTYPES][COUNTS], torch.tensor([2.0, 1, 1], dtype=F64))
    assert rows_of(agg.tensors) == [([0, 0], 0), ([1, 0], 1), ([30, 0], 0), ([31, 0], 2), ([32, 0], 2)]
    # Round 1: client 0 again, class 0 at [5,5], class 1 at [4,4]: C_0 = (5 + 3)/2 = 4, C_1 = 4, N unchanged;
    # its two old rows give way to its one new row, client 3's rows stay.
    agg, state = a.edge_aggregate([result(0, [[5, 5], [4, 4], [0, 0]], [1, 2, 0], [[2, 0]], [1])], state, 1)
    assert torch.equal(agg.tensors[PROTOTYPES][MEANS], torch.tensor([[4.0, 4], [4, 4], [6, 6]], dtype=F64))
    assert torch.equal(agg.tensors[PROTOTYPES][COUNTS], torch.tensor([2.0, 1, 1], dtype=F64))
    assert rows_of(agg.tensors) == [([2, 0], 1), ([30, 0], 0), ([31, 0], 2), ([32, 0], 2)]
    a.check_contribution(a.init_global(nn.Linear(1, 3)), [0, 3], agg.tensors, agg.weight, edge_id=0)
    with pytest.raises(ValueError):
        a.edge_aggregate([], state, 2)


# ---- cloud ----------------------------------------------------------------------------------------

CENTRES = torch.tensor([[4.0, 0.0], [0.0, 4.0], [-4.0, -4.0]])


def triple(prototypes, counts, seed: int) -> dict:
    """(C^l, N^l, X^l) with 30 features around three well-separated class centres."""
    labels = torch.arange(30) % 3
    noise = 0.5 * torch.randn(30, 2, generator=torch.Generator().manual_seed(seed))
    return {PROTOTYPES: {MEANS: torch.tensor(prototypes, dtype=F64), COUNTS: torch.tensor(counts, dtype=F64)},
            SAMPLE: {FEATURES: CENTRES[labels] + noise, LABELS: labels}}


def contribution(edge: int, tensors: dict, metrics: dict | None = None) -> Contribution:
    clients = (ClientParticipation(client_id=k, num_samples=1, loss=0.0, metrics=m) for k, m in (metrics or {}).items())
    return Contribution(edge, 0, tensors, 1.0, tuple(sorted(clients, key=lambda c: c.client_id)))


def accuracy(global_, x, y) -> float:
    g = global_[HEAD]
    return float(((x @ g[WEIGHT].T + g["bias"]).argmax(1) == y).float().mean())


def test_cloud_update_by_hand_over_two_buffers():
    a = hfpl(feature_dim=2)
    g0 = a.init_global(nn.Linear(1, 3))  # J = 3 from the model's last layer, d = 2
    e0 = triple([[1, 0], [0, 3], [0, 0]], [2, 1, 0], seed=0)
    e1 = triple([[4, 0], [0, 0], [5, 5]], [1, 0, 2], seed=1)
    g1, s1 = a.cloud_update(g0, [contribution(1, e1, {1: {"accuracy": 0.0, "test_loss": 2.0}}),
                                 contribution(0, e0, {0: {"accuracy": 0.5, "test_loss": 1.0, "proto_accuracy": 0.25},
                                                      3: {"accuracy": 1.0, "test_loss": 3.0}})], {}, 0)
    # C̄_0 = (2·1 + 1·4)/3 = 2; C̄_1 = edge 0's [0,3] alone; C̄_2 = edge 1's [5,5] alone.
    assert torch.equal(g1[PROTOTYPES][MEANS], torch.tensor([[2.0, 0], [0, 3], [5, 5]], dtype=F64))
    assert torch.equal(g1[PROTOTYPES][COUNTS], torch.tensor([3.0, 1, 2], dtype=F64))
    x, y = torch.cat([e0[SAMPLE][FEATURES], e1[SAMPLE][FEATURES]]), torch.cat([e0[SAMPLE][LABELS], e1[SAMPLE][LABELS]])
    assert not torch.equal(g1[HEAD][WEIGHT], g0[HEAD][WEIGHT])
    # Measured: the seeded initial G gets a third of these right; 5 epochs separate the clusters.
    assert accuracy(g0, x, y) < accuracy(g1, x, y) == 1.0
    # Latest figures per client of 6; the evaluation is their plain mean over the 3 clients seen.
    nan = math.nan
    torch.testing.assert_close(s1[EVALUATION]["accuracy"], torch.tensor([0.5, 0.0, nan, 1.0, nan, nan], dtype=F64),
                               equal_nan=True)
    torch.testing.assert_close(s1[EVALUATION]["proto_accuracy"],
                               torch.tensor([0.25, nan, nan, nan, nan, nan], dtype=F64),
                               equal_nan=True)
    assert a.evaluate(g1, s1) == Evaluation(2.0, 0.5, 3)  # loss (1 + 2 + 3)/3, accuracy (0.5 + 0 + 1)/3

    e2 = triple([[0, 0], [0, 9], [0, 0]], [0, 1, 0], seed=2)
    e0b = triple([[7, 0], [0, 3], [1, 1]], [1, 1, 2], seed=3)
    g2, s2 = a.cloud_update(g1, [contribution(0, e0b, {0: {"accuracy": 0.8, "test_loss": 0.5}}),
                                 contribution(2, e2)], s1, 1)
    # Latest: edge 0 (e0b), edge 1 (e1), edge 2 (e2). C̄_0 = (1·7 + 1·4)/2 = 5.5; C̄_1 = (1·3 + 1·9)/2 = 6
    # in its second coordinate; C̄_2 = (2·[1,1] + 2·[5,5])/4 = [3,3].
    torch.testing.assert_close(g2[PROTOTYPES][MEANS], torch.tensor([[5.5, 0], [0, 6], [3, 3]], dtype=F64),
                               rtol=0, atol=1e-12)
    assert torch.equal(g2[PROTOTYPES][COUNTS], torch.tensor([2.0, 2, 4], dtype=F64))
    memory = unpack(s2[EDGES], EdgeMemory)
    for l, sent in [(0, e0b), (1, e1), (2, e2)]:  # edge 1 was not in the buffer: its X^{l,cloud} stays
        assert torch.equal(memory[l].features, sent[SAMPLE][FEATURES])
        assert torch.equal(memory[l].labels, sent[SAMPLE][LABELS])
        assert torch.equal(memory[l].means, sent[PROTOTYPES][MEANS])
    # the previous state is not mutated
    assert torch.equal(unpack(s1[EDGES], EdgeMemory)[0].features, e0[SAMPLE][FEATURES])
    # Client 0's 0.8 and 0.5 replace its 0.5 and 1: accuracy (0.8 + 0 + 1)/3, loss (0.5 + 2 + 3)/3.
    e = a.evaluate(g2, s2)
    assert (e.loss, e.accuracy, e.samples) == (pytest.approx(11 / 6), pytest.approx(0.6), 3)


def test_cloud_update_refuses_two_triples_of_one_edge():
    a = hfpl(feature_dim=2)
    t = triple([[1, 0], [0, 3], [0, 0]], [2, 1, 0], seed=0)
    with pytest.raises(ValueError, match="two triples of one edge"):
        a.cloud_update(a.init_global(nn.Linear(1, 3)), [contribution(1, t), contribution(1, t)], {}, 0)


# ---- wire checks ----------------------------------------------------------------------------------

WHERE = {"prototypes": (PROTOTYPES, MEANS), "class_counts": (PROTOTYPES, COUNTS), "counts": (PROTOTYPES, COUNTS),
         "features": (SAMPLE, FEATURES), "labels": (SAMPLE, LABELS)}


def as_record(tensors: dict) -> dict:
    """The short names below placed in their groups."""
    record: dict = {}
    for name, t in tensors.items():
        group, member = WHERE[name]
        record.setdefault(group, {})[member] = t
    return record


def good_result() -> dict:
    # J = 3, d = 2, feature_cap = 4.
    return {"prototypes": torch.zeros(3, 2, dtype=F64), "class_counts": torch.tensor([2, 0, 1]),
            "features": torch.zeros(3, 2), "labels": torch.tensor([0, 2, 0])}


def good_triple() -> dict:
    # Edge 0 of 6 clients over 3 edges serves clients 0 and 3: 2 clients × cap 4 = at most 8 features.
    return {"prototypes": torch.zeros(3, 2, dtype=F64), "counts": torch.tensor([2.0, 0, 1], dtype=F64),
            "features": torch.zeros(8, 2), "labels": torch.full((8,), 2)}


BAD_RESULTS = {
    "label -1": {"labels": torch.tensor([0, -1, 0])},
    "label J": {"labels": torch.tensor([0, 3, 0])},
    "lengths differ": {"labels": torch.tensor([0, 2])},
    "over the cap": {"features": torch.zeros(5, 2), "labels": torch.zeros(5, dtype=I64)},
    "negative count": {"class_counts": torch.tensor([2, -1, 1])},
    "float counts": {"class_counts": torch.tensor([2.0, 0.5, 1.0])},
    "NaN prototype": {"prototypes": torch.tensor([[0.0, math.nan], [0, 0], [0, 0]], dtype=F64)},
    "NaN feature": {"features": torch.tensor([[0.0, 0], [math.nan, 0], [0, 0]])},
    "huge prototype": {"prototypes": torch.tensor([[0.0, 1e20], [0, 0], [0, 0]], dtype=F64)},
}
BAD_TRIPLES = {
    "label -1": {"labels": torch.full((8,), -1)},
    "label J": {"labels": torch.full((8,), 3)},
    "lengths differ": {"labels": torch.full((7,), 2)},
    "over the edge's cap": {"features": torch.zeros(9, 2), "labels": torch.full((9,), 2)},
    "negative count": {"counts": torch.tensor([2.0, -1, 1], dtype=F64)},
    "fractional count": {"counts": torch.tensor([2.0, 0.5, 1], dtype=F64)},
    "more than the edge's clients": {"counts": torch.tensor([3.0, 0, 1], dtype=F64)},
    "NaN prototype": {"prototypes": torch.tensor([[0.0, math.nan], [0, 0], [0, 0]], dtype=F64)},
    "huge prototype": {"prototypes": torch.tensor([[0.0, 1e20], [0, 0], [0, 0]], dtype=F64)},
    "huge feature": {"features": torch.full((8, 2), -1e7)},
}


@pytest.mark.parametrize("bad", BAD_RESULTS)
def test_check_result_refuses(bad):
    a = hfpl(feature_dim=2, feature_cap=4)
    task = a.init_global(nn.Linear(1, 3))
    a.check_result(task, as_record(good_result()))
    with pytest.raises(InvalidContent):
        a.check_result(task, as_record({**good_result(), **BAD_RESULTS[bad]}))


@pytest.mark.parametrize("bad", BAD_TRIPLES)
def test_check_contribution_refuses(bad):
    a = hfpl(feature_dim=2, feature_cap=4)
    global_ = a.init_global(nn.Linear(1, 3))
    a.check_contribution(global_, [0, 3], as_record(good_triple()), 2.0, edge_id=0)
    with pytest.raises(InvalidContent):
        a.check_contribution(global_, [0, 3], as_record({**good_triple(), **BAD_TRIPLES[bad]}), 2.0, edge_id=0)


def test_contribution_bounds_follow_the_edge():
    """Edge 0 serves 2 of the 6 clients: 8 features and counts of 2 are its limit, not the run's 24 and 6."""
    a = hfpl(feature_dim=2, feature_cap=4)
    global_ = a.init_global(nn.Linear(1, 3))
    wide = as_record({**good_triple(), "features": torch.zeros(24, 2), "labels": torch.full((24,), 2),
                      "counts": torch.tensor([6.0, 0, 1], dtype=F64)})
    a.check_contribution(global_, [0, 3], wide, 2.0)  # no edge named: the run's bound
    with pytest.raises(InvalidContent, match="n<=8"):
        a.check_contribution(global_, [0, 3], wide, 2.0, edge_id=0)


# ---- the reference runner -------------------------------------------------------------------------

def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_reference_is_deterministic_per_seed():
    c = config()
    first, second, other = run_reference(c), run_reference(c), run_reference(c.model_copy(update={"seed": 1}))
    assert same(first.global_state, second.global_state)
    assert not same(first.global_state, other.global_state)


@pytest.mark.parametrize("kind", ["linear", "cosine", "mlp"])
def test_loading_g_draws_nothing_from_the_default_generator_and_copies_its_state(kind):
    """Clients load G on their own threads while another client's extractor is built from the seeded default
    generator (seeding.seeded_default_generator): a draw of G's load would move that extractor's weights off its
    seed, and the run off the reference's."""
    a = hfpl(classifier=kind, feature_dim=4)
    head = a.init_global(nn.Linear(1, 3))[HEAD]
    torch.manual_seed(123)
    before = torch.get_rng_state()
    g = a.classifier(head, trainable=True)
    assert torch.equal(torch.get_rng_state(), before)
    assert same(g.state_dict(), head) and all(p.requires_grad for p in g.parameters())
    with torch.no_grad():
        next(g.parameters()).add_(1.0)
    assert same(a.init_global(nn.Linear(1, 3))[HEAD], head)  # G trained by the cloud leaves the record's G as is


def test_a_slow_edge_arrives_stale_and_replaying_the_schedule_reproduces_the_run():
    c = config().model_copy(update={"rounds": 4})
    run = run_reference(c, edge_slowdown={2: 3.0})
    # Edges 0 and 1 finish at t = 1, 2, 3, 4 (one unit per round); edge 2's first round ends at t = 3 and
    # loses the tie at t = 3 to edges 0 and 1 (ties by id), so update 3 takes it (base 0) and edge 0 (base 3).
    assert schedule_of(run.history) == [[(0, 0), (1, 0)], [(0, 1), (1, 1)], [(0, 2), (1, 2)], [(2, 0), (0, 3)]]
    assert [[x.staleness for x in h.contributions] for h in run.history] == [[0, 0], [0, 0], [0, 0], [3, 0]]
    assert all(len({x.edge_id for x in h.contributions}) == 2 for h in run.history)
    replay = run_reference(c, schedule=schedule_of(run.history))
    assert same(replay.global_state, run.global_state)
    replayed, ran = flatten(replay.cloud_state), flatten(run.cloud_state)
    assert replayed.keys() == ran.keys()
    for k in ran:  # the evaluation holds NaN for clients never seen, and NaN != NaN
        assert torch.equal(replayed[k].nan_to_num(-1.0), ran[k].nan_to_num(-1.0)), k


def test_history_has_the_mean_of_every_clients_latest_nearest_prototype_accuracy():
    """A server-side figure: the cloud keeps each client's latest report, while a record's client_metrics
    only average the clients of that update."""
    run = run_reference(config().model_copy(update={"rounds": 4}))
    latest: dict[int, float] = {}
    for record in run.history:
        latest.update({c.client_id: c.metrics["proto_accuracy"]
                       for c in record.clients if "proto_accuracy" in c.metrics})
        if latest:
            assert record.server_metrics == {"proto_accuracy": pytest.approx(sum(latest.values()) / len(latest))}
        else:  # no global prototypes yet in the clients' first round
            assert record.server_metrics == {}
    assert latest and len(latest) > len(run.history[-1].clients)  # more clients than the last update's


# ---- levers (measured on FedProto's protocol: docs/benchmarks/fedproto-protocol.md) -----------------

def test_a_mean_over_d_is_the_sum_at_a_d_times_smaller_weight():
    centre = torch.zeros(10, 64, dtype=F64)
    centre[:, 0] = 3.0
    counts = torch.ones(10, dtype=F64)
    mean, summed, plain = hfpl(proto_distance="mean", proto_weight=3.2), hfpl(proto_weight=0.05), hfpl()
    u_mean, u_sum = update(mean, task_of(mean, centre, counts)), update(summed, task_of(summed, centre, counts))
    torch.testing.assert_close(flatten(u_mean.state), flatten(u_sum.state), rtol=1e-4, atol=1e-5)
    far = hfpl(proto_distance="mean", proto_weight=0.05)  # the same λ_p pulls d× less
    assert not same(flatten(update(far, task_of(far, centre, counts)).state),
                    flatten(update(plain, task_of(plain, centre, counts)).state))
    assert not same(flatten(u_mean.state), flatten(update(far, task_of(far, centre, counts)).state))


def test_momentum_is_heavy_ball_sgd_for_the_client_and_refused_beside_nesterov():
    a = hfpl(momentum=0.5)
    opt = a.client_optimizer([nn.Parameter(torch.zeros(1))])
    assert isinstance(opt, torch.optim.SGD) and opt.defaults["momentum"] == 0.5 and not opt.defaults["nesterov"]
    assert opt.defaults["lr"] == a.config.local.lr
    assert hfpl().client_optimizer([nn.Parameter(torch.zeros(1))]).defaults["momentum"] == 0
    task = task_of(a)
    assert not same(flatten(update(a, task).state), flatten(update(hfpl(), task).state))
    with pytest.raises(ValueError, match="has its own momentum"):
        registry.parse_config({**SMALL, "local": {**SMALL["local"], "optimizer": "nesterov"},
                               "params": {"momentum": 0.5}})


@pytest.mark.parametrize("change", [{"momentum": 1.0}, {"proto_distance": "max"}, {"classifier": "tree"},
                                    {"inference": "vote"}, {"staleness": "exp"}, {"classifier_scale": 0},
                                    {"classifier_width": 0}])
def test_levers_are_validated(change):
    with pytest.raises(ValueError):
        registry.parse_config({**SMALL, "params": change})


def biased_task(a: HFPL, towards: int):
    """A task whose G says `towards` for every input (a huge bias), with C̄ at G's own rows."""
    task = task_of(a)
    bias = torch.zeros(10)
    bias[towards] = 1e4
    return {**task, HEAD: {**task[HEAD], "bias": bias}}


def test_own_classes_confines_predictions_to_the_clients_classes():
    lacks = int((torch.bincount(train_data(hfpl()).train.y, minlength=10) == 0).nonzero()[0])
    anywhere, own = hfpl(), hfpl(own_classes=True)
    assert update(anywhere, biased_task(anywhere, lacks)).metrics["accuracy"] == 0.0  # always the absent class
    assert update(own, biased_task(own, lacks)).metrics["accuracy"] > 0.1


def test_nearest_prototype_inference_reports_the_nearest_prototype_accuracy():
    a = hfpl(inference="nearest_prototype")
    centre = torch.randn(10, 64, generator=torch.Generator().manual_seed(0), dtype=F64)
    u = update(a, task_of(a, centre, torch.ones(10, dtype=F64)))
    assert u.metrics["accuracy"] == u.metrics["proto_accuracy"]
    b = hfpl()
    v = update(b, task_of(b, centre, torch.ones(10, dtype=F64)))
    assert v.metrics["proto_accuracy"] == u.metrics["proto_accuracy"] and v.metrics["accuracy"] != u.metrics["accuracy"]
    # No C̄ yet: G answers.
    assert update(a, task_of(a)).metrics["accuracy"] == update(b, task_of(b)).metrics["accuracy"]


def test_the_cosine_classifier_ignores_feature_norms_and_trains():
    a = hfpl(classifier="cosine", classifier_scale=5.0, feature_dim=2)
    g0 = a.init_global(nn.Linear(1, 3))
    g = a.classifier(g0[HEAD], trainable=False)
    z = torch.tensor([[1.0, 2.0], [-3.0, 0.5]])
    torch.testing.assert_close(g(z), g(7 * z))
    assert float((g(z) - g0[HEAD]["bias"]).abs().max()) <= 5.0 + 1e-6
    g1, _ = a.cloud_update(g0, [contribution(0, triple([[1, 0], [0, 3], [0, 0]], [2, 1, 0], seed=0))], {}, 0)
    x, y = triple([[0, 0]] * 3, [0, 0, 0], seed=5)[SAMPLE].values()
    trained = a.classifier(g1[HEAD], trainable=False)
    assert float((trained(x).argmax(1) == y).float().mean()) == 1.0


def xor_triple(n: int = 200) -> dict:
    """(C^l, N^l, X^l) of 2 classes that no line separates: the sign of z_0·z_1 (XOR)."""
    z = 2 * torch.rand(n, 2, generator=torch.Generator().manual_seed(0)) - 1
    labels = (z[:, 0] * z[:, 1] > 0).long()
    return {PROTOTYPES: {MEANS: torch.zeros(2, 2, dtype=F64), COUNTS: torch.tensor([2.0, 2.0], dtype=F64)},
            SAMPLE: {FEATURES: z, LABELS: labels}}


def test_the_default_classifier_is_the_plain_linear_layer_bit_for_bit():
    """The default G is nn.Linear, seeded as before, trained by the same SGD loop: classifier="mlp" added a
    kind, it did not change the linear one (a run's digest against main's code:
    docs/benchmarks/fedproto-protocol.md)."""
    a = hfpl(feature_dim=2, classifier_epochs=3)
    g0 = a.init_global(nn.Linear(1, 2))
    with seeded_default_generator(derive_seed(0, MODEL_INIT, CLASSIFIER)):
        g = nn.Linear(2, 2)
    assert list(g0[HEAD]) == [WEIGHT, "bias"]
    assert torch.equal(g0[HEAD][WEIGHT], g.weight) and torch.equal(g0[HEAD]["bias"], g.bias)
    tensors = xor_triple()
    g1, _ = a.cloud_update(g0, [contribution(0, tensors)], {}, 0)
    x, y = tensors[SAMPLE][FEATURES], tensors[SAMPLE][LABELS]
    opt = torch.optim.SGD(g.parameters(), lr=a.params.classifier_lr)
    generator = torch_generator(0, CLASSIFIER, 0)
    for _ in range(3):
        for idx in batches(len(y), a.params.classifier_batch_size, generator):
            opt.zero_grad()
            nn.functional.cross_entropy(g(x[idx]), y[idx]).backward()
            opt.step()
    assert torch.equal(g1[HEAD][WEIGHT], g.weight) and torch.equal(g1[HEAD]["bias"], g.bias)
    assert set(a.model_parameters(g1)) == {"prototypes", "prototype_counts", "classifier.weight", "classifier.bias"}


def test_the_mlp_classifier_separates_what_the_linear_one_cannot():
    tensors = xor_triple()
    x, y = tensors[SAMPLE][FEATURES], tensors[SAMPLE][LABELS]
    accuracy_of = {}
    for kind in ("linear", "mlp"):
        a = hfpl(feature_dim=2, classifier=kind, classifier_width=16, classifier_epochs=200)
        g0 = a.init_global(nn.Linear(1, 2))
        g1, _ = a.cloud_update(g0, [contribution(0, tensors)], {}, 0)
        g = a.classifier(g1[HEAD], trainable=False)
        accuracy_of[kind] = float((g(x).argmax(1) == y).float().mean())
    assert sorted(g1[HEAD]) == ["bias", "hidden.bias", "hidden.weight", WEIGHT]
    assert g1[HEAD]["hidden.weight"].shape == (16, 2) and g1[HEAD][WEIGHT].shape == (2, 16)
    # Measured: a line gets 53% of these right, one hidden layer of 16 units 99%.
    assert accuracy_of["linear"] < 0.75 < 0.95 < accuracy_of["mlp"]


def test_the_client_trains_its_extractor_through_the_frozen_mlp_classifier():
    a = hfpl(classifier="mlp", classifier_width=32)
    task = task_of(a)
    before = {k: v.clone() for k, v in task[HEAD].items()}
    u = update(a, task)
    assert all(torch.equal(task[HEAD][k], before[k]) for k in before)  # G is frozen at the client
    f0 = a.feature_extractor(CLIENT, tuple(train_data(a).train.x.shape[1:])).state_dict()
    assert not same(flatten(u.state), flatten({EXTRACTOR: f0}))  # f_i moved
    assert not same(flatten(u.state), flatten(update(hfpl(), task_of(hfpl())).state))  # through another G
    # The served model carries the hidden layer, and a client is evaluated with it.
    served = a.model_parameters(task)
    assert {"classifier.hidden.weight", "classifier.hidden.bias"} <= set(served)
    # u's figures are its trained f_i with the G it received: the served (C̄, G) and f_i give them again.
    assert a.evaluate_client(CLIENT, u.state, served, train_data(a).test) == u.metrics


def test_fedbuff_staleness_weighs_a_stale_triple_down_in_the_prototypes():
    a, plain = hfpl(feature_dim=2, staleness="fedbuff"), hfpl(feature_dim=2)
    g0 = a.init_global(nn.Linear(1, 3))
    fresh = triple([[1, 0], [0, 3], [0, 0]], [1, 1, 0], seed=0)
    stale = triple([[4, 0], [0, 0], [5, 5]], [1, 0, 2], seed=1)
    buffer = [Contribution(0, 3, fresh, 1.0, ()), Contribution(1, 0, stale, 1.0, ())]  # edge 1's from version 0
    g3, state = a.cloud_update(g0, buffer, {}, 3)  # at version 3: τ = 3, weight 1/√4 = 1/2
    # C̄_0 = (1·1 + ½·4)/(1 + ½) = 2; C̄_1 = edge 0's alone; C̄_2 = edge 1's alone.
    torch.testing.assert_close(g3[PROTOTYPES][MEANS], torch.tensor([[2.0, 0], [0, 3], [5, 5]], dtype=F64))
    assert torch.equal(g3[PROTOTYPES][COUNTS], torch.tensor([1.5, 1, 1], dtype=F64))
    # Its next, fresh triple replaces the halved one exactly.
    again = triple([[2, 0], [0, 0], [1, 1]], [1, 0, 2], seed=2)
    g4, _ = a.cloud_update(g3, [Contribution(1, 4, again, 1.0, ())], state, 4)
    torch.testing.assert_close(g4[PROTOTYPES][MEANS], torch.tensor([[1.5, 0], [0, 3], [1, 1]], dtype=F64))
    # Without the rule a stale triple counts in full.
    g_plain, _ = plain.cloud_update(g0, buffer, {}, 3)
    torch.testing.assert_close(g_plain[PROTOTYPES][MEANS], torch.tensor([[2.5, 0], [0, 3], [5, 5]], dtype=F64))
