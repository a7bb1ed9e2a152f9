"""The incremental prototype means against the plain means they must equal, by hand and by hypothesis."""
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fl_services.shared.core.algorithms.prototypes import (
    ClientPrototypes,
    EdgePrototypes,
    cloud_update_prototypes,
    edge_aggregate_prototypes,
    empty,
)

PROPERTY = settings(max_examples=100, deadline=None)
values = st.floats(-100, 100, allow_nan=False, allow_infinity=False)


def t(*rows) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float64)


def client(means, present) -> ClientPrototypes:
    return ClientPrototypes(t(*means), torch.tensor(present))


def edge(means, counts) -> EdgePrototypes:
    return EdgePrototypes(t(*means), t(*counts))


def close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    torch.testing.assert_close(actual, expected, rtol=0, atol=1e-9)


# ---- by hand ---------------------------------------------------------------------------------------

def test_edge_by_hand_a_second_round_replaces_client_0s_prototype():
    # J = 2, d = 1. Round 1: client 0 has class 0 at 2; client 1 has class 0 at 4 and class 1 at 10.
    # C_0 = (2 + 4)/2 = 3, N_0 = 2; C_1 = 10, N_1 = 1.
    c, prev = edge_aggregate_prototypes(empty(2, 1), {}, {1: client([[4.0], [10.0]], [True, True]),
                                                          0: client([[2.0], [0.0]], [True, False])})
    assert torch.equal(c.means, t([3.0], [10.0])) and torch.equal(c.counts, t(2.0, 1.0))
    # Round 2, client 0 alone, class 0 at 8: Ĉ_0 = 2·3 + 8 − 2 = 12, N_0 stays 2, C_0 = 6 = (8 + 4)/2.
    c, prev = edge_aggregate_prototypes(c, prev, {0: client([[8.0], [0.0]], [True, False])})
    assert torch.equal(c.means, t([6.0], [10.0])) and torch.equal(c.counts, t(2.0, 1.0))
    # Round 3, client 0 now also has class 1 at 4: a new contributor, N_1 = 2, C_1 = (10 + 4)/2 = 7.
    c, prev = edge_aggregate_prototypes(c, prev, {0: client([[8.0], [4.0]], [True, True])})
    assert torch.equal(c.means, t([6.0], [7.0])) and torch.equal(c.counts, t(2.0, 2.0))
    # Round 4, client 1 reports class 0 at 0 but no class 1: C_0 = (8 + 0)/2 = 4; its 10 for class 1
    # stays its latest value, so C_1 = 7 and N_1 = 2 are unchanged.
    c, prev = edge_aggregate_prototypes(c, prev, {1: client([[0.0], [0.0]], [True, False])})
    assert torch.equal(c.means, t([4.0], [7.0])) and torch.equal(c.counts, t(2.0, 2.0))
    assert torch.equal(prev[1].means, t([0.0], [10.0])) and prev[1].present.tolist() == [True, True]


def test_edge_leaves_its_inputs_alone():
    current = edge([[3.0]], [1.0])
    previous = {0: client([[3.0]], [True])}
    edge_aggregate_prototypes(current, previous, {0: client([[5.0]], [True]), 1: client([[1.0]], [True])})
    assert torch.equal(current.means, t([3.0])) and torch.equal(current.counts, t(1.0))
    assert list(previous) == [0] and torch.equal(previous[0].means, t([3.0]))


def test_cloud_by_hand_a_second_buffer_replaces_edge_0():
    # J = 2, d = 1; nobody has class 1. Buffer 1: edge 0 (2, N=1), edge 1 (5, N=2):
    # C̄_0 = (1·2 + 2·5)/3 = 4, total 3; class 1 has total 0, so C̄_1 = 0 whatever the edges sent.
    means, total, prev = cloud_update_prototypes(
        torch.zeros(2, 1, dtype=torch.float64), {}, {1: edge([[5.0], [9.0]], [2.0, 0.0]),
                                                     0: edge([[2.0], [7.0]], [1.0, 0.0])})
    assert torch.equal(means, t([4.0], [0.0])) and torch.equal(total, t(3.0, 0.0))
    # Buffer 2: edge 0 (8, N=3): Ĉ_0 = 3·4 + 3·8 − 1·2 = 34, total 3 − 1 + 3 = 5, C̄_0 = 34/5 = (3·8 + 2·5)/5.
    means, total, prev = cloud_update_prototypes(means, prev, {0: edge([[8.0], [1.0]], [3.0, 0.0])})
    close(means, t([34 / 5], [0.0]))
    assert torch.equal(total, t(5.0, 0.0))
    # Buffer 3: edge 1 withdraws class 0 (N=0): only edge 0's 8 remains, C̄_0 = 3·8/3 = 8.
    means, total, prev = cloud_update_prototypes(means, prev, {1: edge([[5.0], [0.0]], [0.0, 0.0])})
    close(means, t([8.0], [0.0]))
    assert torch.equal(total, t(3.0, 0.0))
    assert sorted(prev) == [0, 1] and torch.equal(prev[1].counts, t(0.0, 0.0))


# ---- properties ------------------------------------------------------------------------------------

@st.composite
def edge_history(draw):
    """J classes, d dims, a fixed class set per client, and rounds of (participants in some order, c_i)."""
    num_classes, dim, num_clients = draw(st.integers(1, 4)), draw(st.integers(1, 3)), draw(st.integers(1, 5))
    classes = [draw(st.lists(st.booleans(), min_size=num_classes, max_size=num_classes)) for _ in range(num_clients)]
    rounds = []
    for _ in range(draw(st.integers(1, 6))):
        ids = draw(st.permutations(range(num_clients)))[: draw(st.integers(0, num_clients))]
        rounds.append([(i, draw(st.lists(values, min_size=num_classes * dim, max_size=num_classes * dim)))
                       for i in ids])
    return num_classes, dim, classes, rounds


@PROPERTY
@given(edge_history())
def test_edge_mean_is_the_plain_mean_of_each_clients_latest_prototype(history):
    num_classes, dim, classes, rounds = history
    current, previous = empty(num_classes, dim), {}
    latest: dict[int, torch.Tensor] = {}
    for participants in rounds:
        updates = {}
        for i, flat in participants:  # dict order = the drawn participation order
            latest[i] = torch.tensor(flat, dtype=torch.float64).reshape(num_classes, dim)
            updates[i] = ClientPrototypes(latest[i], torch.tensor(classes[i]))
        current, previous = edge_aggregate_prototypes(current, previous, updates)
        for j in range(num_classes):
            having = [latest[i][j] for i in latest if classes[i][j]]
            assert current.counts[j] == len(having)
            close(current.means[j], torch.stack(having).mean(0) if having else torch.zeros(dim, dtype=torch.float64))


@st.composite
def cloud_history(draw):
    """J classes, d dims, and buffers of distinct edges each sending arbitrary (C^l, N^l)."""
    num_classes, dim, num_edges = draw(st.integers(1, 4)), draw(st.integers(1, 3)), draw(st.integers(1, 4))
    buffers = []
    for _ in range(draw(st.integers(1, 6))):
        ids = draw(st.permutations(range(num_edges)))[: draw(st.integers(1, num_edges))]
        buffers.append([(l, draw(st.lists(values, min_size=num_classes * dim, max_size=num_classes * dim)),
                         draw(st.lists(st.integers(0, 6), min_size=num_classes, max_size=num_classes)))
                        for l in ids])
    return num_classes, dim, buffers


@PROPERTY
@given(cloud_history())
def test_cloud_mean_is_the_count_weighted_mean_of_each_edges_latest_means(history):
    num_classes, dim, buffers = history
    means, previous = torch.zeros(num_classes, dim, dtype=torch.float64), {}
    latest: dict[int, EdgePrototypes] = {}
    for buffer in buffers:
        sent = {}
        for l, flat, counts in buffer:
            latest[l] = sent[l] = EdgePrototypes(torch.tensor(flat, dtype=torch.float64).reshape(num_classes, dim),
                                                 torch.tensor(counts, dtype=torch.float64))
        means, total, previous = cloud_update_prototypes(means, previous, sent)
        expected_total = sum(e.counts for e in latest.values())
        weighted = sum(e.counts[:, None] * e.means for e in latest.values())
        expected = torch.where((expected_total > 0)[:, None], weighted / expected_total.clamp(min=1)[:, None], 0.0)
        assert torch.equal(total, expected_total)
        close(means, expected)
