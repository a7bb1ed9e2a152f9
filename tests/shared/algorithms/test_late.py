"""Late answers joining the edge's next contribution (policy.late = 'join'): the configs it applies to, and the
reference runner's rounds in virtual time and their replay from the history."""
import math

import pytest
import torch
from pydantic import ValidationError

from fl_services.shared.core.algorithms import registry
from fl_services.shared.core.config import RunConfig
from fl_services.shared.core.reference import joined_of, run_reference, schedule_of

SMALL = dict(model={"name": "logreg"}, data={"dataset": "digits", "num_clients": 6}, local={"lr": 0.1})
JOIN = {"answers": 1, "late": "join"}


@pytest.mark.parametrize(("given", "why"), [
    ({"policy": {"late": "join"}}, "it needs policy.answers = K"),
    ({"algorithm": "scaffold"}, "scaffold cannot weigh a step computed on an older version"),
    ({"algorithm": "hfpl", "model": {"name": "mlp"}}, "hfpl cannot weigh"),
    ({"topology": {"num_edges": 3, "edge_rounds": 2}}, "topology.edge_rounds > 1"),
    ({"aggregation": {"edge": "median"}}, "robust aggregation"),
    ({"aggregation": {"cloud": "median"}}, "robust aggregation"),
    ({"privacy": {"noise": "edge", "noise_multiplier": 0.1}}, "differential privacy"),
    ({"secure_aggregation": {"edge": True}, "policy": {"answers": 2, "late": "join"}}, "secure aggregation's masks"),
    ({"evaluation": "both"}, "evaluation 'cloud'"),
])
def test_join_is_refused_where_a_late_step_cannot_count_saying_why(given, why):
    config = {**SMALL, "topology": {"num_edges": 3}, "policy": JOIN, **given}
    with pytest.raises(ValidationError, match="1 validation error") as refused:
        registry.parse_config(config)
    assert "policy.late" in str(refused.value)
    assert why in str(refused.value)


@pytest.mark.parametrize("algorithm", ["fedavg", "fedprox", "fedsgd"])
def test_model_averaging_algorithms_take_join(algorithm):
    config = registry.parse_config({**SMALL, "algorithm": algorithm, "topology": {"num_edges": 3}, "policy": JOIN})
    assert config.policy.late == "join"
    assert RunConfig(**SMALL).policy.late == "drop"


def test_a_late_answer_joins_its_edges_next_round_weighed_by_its_own_staleness():
    # 3 edges of 2 clients, the cloud waiting for all 3 (B = L), each edge round closing at its first answer (that of
    # least modelled time: the fewer samples, devices being equal). In unit time the other answer comes as the round
    # closes: it joins the edge's next round, where its device is busy (one task), so the round after sets both again.
    config = RunConfig(**SMALL, rounds=5, topology={"num_edges": 3}, policy=JOIN)
    result = run_reference(config)
    parts = [[(c.edge_id, c.base_version, c.joined, c.clients, c.staleness_weight) for c in h.contributions]
             for h in result.history]
    fast = {c.edge_id: c.client_id for c in result.history[0].clients}
    slow = {e: next(k for k in config.clients_of_edge(e) if k != fast[e]) for e in range(3)}
    s1 = 1 / math.sqrt(2)  # s(1): each late part was computed on the version before its update's

    def update(v: int, late: bool) -> list:
        return [part for e in range(3) for part in
                [(e, v, False, None, 1.0), *([(e, v - 1, True, [slow[e]], s1)] if late else [])]]

    assert parts == [update(0, False), update(1, True), update(2, False), update(3, True), update(4, False)]
    first = sorted(fast.values())
    assert [sorted(c.client_id for c in h.clients) for h in result.history] == [first, list(range(6))] * 2 + [first]
    assert result.client_tasks == [6, 9, 15, 18, 24]  # no work is set twice, none is wasted but the last
    replay = run_reference(config, schedule=schedule_of(result.history), joined=joined_of(result.history))
    for name, t in result.global_state.items():
        assert torch.equal(t, replay.global_state[name])
    with pytest.raises(ValueError, match="joined_of"):
        run_reference(config, schedule=schedule_of(result.history))


def test_a_replay_whose_joins_do_not_fit_its_rounds_is_an_error():
    config = RunConfig(**SMALL, rounds=2, topology={"num_edges": 3}, policy=JOIN)
    result = run_reference(config)
    wrong = {key: [(v, [k - 3]) for v, ids in parts for k in ids] for key, parts in joined_of(result.history).items()}
    with pytest.raises(ValueError, match="which have none outstanding"):
        run_reference(config, schedule=schedule_of(result.history), joined=wrong)
