"""Buffered asynchronous averaging at the cloud (B < L): the staleness functions, the rule they weigh FedAvg's
step by, dropped contributions, and the algorithms refused because their server memory takes no stale update."""
import math
from datetime import datetime, timezone

import pytest
import torch
from pydantic import ValidationError

from fl_services.shared.core.algorithms import registry, staleness
from fl_services.shared.core.algorithms.base import MODEL, ClientResult, Contribution
from fl_services.shared.core.cloud_round import round_record, run_cloud_round
from fl_services.shared.core.config import RunConfig, StalenessConfig
from fl_services.shared.core.edge_round import device_seconds, first_answers
from fl_services.shared.core.reference import run_reference
from fl_services.shared.core.reports import ClientParticipation

SMALL = dict(model={"name": "logreg"}, data={"dataset": "digits", "num_clients": 6}, local={"lr": 0.1})
ASYNC = {"num_edges": 3, "buffer_size": 2}


@pytest.mark.parametrize(("config", "tau", "expected"), [
    ({}, 0, 1.0), ({}, 3, 0.5), ({}, 8, 1 / 3),
    ({"function": "constant"}, 7, 1.0),
    ({"function": "polynomial"}, 3, 0.5),  # exponent left out: FedBuff's 1/2
    ({"function": "polynomial", "exponent": 1.0}, 4, 0.2),
    ({"function": "polynomial", "exponent": 2.0}, 1, 0.25),
    ({"max": 2}, 2, 1 / math.sqrt(3)), ({"max": 2}, 3, None), ({"max": 0}, 0, 1.0), ({"max": 0}, 1, None),
])
def test_staleness_functions(config, tau, expected):
    got = staleness.weight(StalenessConfig(**config), tau)
    assert got == (None if expected is None else pytest.approx(expected, rel=1e-12))


def test_a_negative_staleness_is_an_error():
    with pytest.raises(ValueError, match="newer"):
        staleness.weight(StalenessConfig(), -1)


@pytest.mark.parametrize(("given", "fragment"), [
    ({"function": "fedbuff", "exponent": 1.0}, "staleness.exponent is the polynomial's"),
    ({"function": "constant", "exponent": 1.0}, "takes none"),
    ({"function": "linear"}, "'fedbuff', 'constant' or 'polynomial'"),
    ({"exponent": -1}, "greater than 0"),
    ({"max": -1}, "greater than or equal to 0"),
    ({"maximum": 3}, "Extra inputs are not permitted"),
])
def test_a_bad_staleness_config_is_refused_saying_why(given, fragment):
    with pytest.raises(ValidationError, match="1 validation error") as refused:
        registry.parse_config({**SMALL, "topology": {**ASYNC, "staleness": given}})
    assert fragment in str(refused.value)


@pytest.mark.parametrize(("algorithm", "why"), [
    ("scaffold", "control variate"), ("fedvarp", "server memory"), ("clusterfedvarp", "server memory"),
    ("pfedme", "pulls θ back"), ("fedrolex", "defined only for contributions computed on the current global state"),
])
def test_algorithms_whose_server_memory_takes_no_stale_update_are_refused_a_smaller_buffer(algorithm, why):
    with pytest.raises(ValidationError, match="1 validation error") as refused:
        registry.parse_config({**SMALL, "algorithm": algorithm, "topology": ASYNC})
    assert f"{algorithm} is synchronous: topology.buffer_size must equal num_edges (3), got 2" in str(refused.value)
    assert why in str(refused.value)


@pytest.mark.parametrize("algorithm", ["fedavg", "fedprox", "fedsgd"])
def test_model_averaging_algorithms_take_a_smaller_buffer(algorithm):
    config = registry.parse_config({**SMALL, "algorithm": algorithm, "topology": ASYNC})
    assert registry.get_algorithm_class(algorithm).asynchronous(config)
    assert not registry.get_algorithm_class(algorithm).asynchronous(
        registry.parse_config({**SMALL, "algorithm": algorithm, "topology": {"num_edges": 3}}))


def test_hfpl_keeps_its_own_staleness_weight():
    with pytest.raises(ValidationError, match="params.staleness"):
        registry.parse_config({**SMALL, "model": {"name": "mlp"}, "algorithm": "hfpl",
                               "topology": {**ASYNC, "staleness": {"max": 3}}})


def _contribution(edge_id: int, base: int, step: float, weight: float) -> Contribution:
    return Contribution(edge_id, base, {MODEL: {"w": torch.full((2,), step * weight, dtype=torch.float32)}}, weight,
                        (ClientParticipation(client_id=edge_id, num_samples=int(weight), loss=1.0),))


def _cloud(config: dict) -> tuple:
    algorithm = registry.create(RunConfig(**{**SMALL, "model": {"name": "logreg"}}, topology=config))
    return algorithm, {MODEL: {"w": torch.zeros(2)}}


def test_fresh_contributions_are_used_as_they_came():
    algorithm, global_ = _cloud({"num_edges": 3})
    fresh = [_contribution(0, 5, 1.0, 4), _contribution(1, 5, 3.0, 2)]
    outcome = run_cloud_round(algorithm, global_, fresh, {}, 5, evaluate=False)
    expected, _ = algorithm.cloud_update(global_, [algorithm.from_wire(global_, c) for c in fresh], {}, 5)
    assert torch.equal(outcome.global_[MODEL]["w"], expected[MODEL]["w"])
    assert outcome.staleness_weights == (1.0, 1.0)


def test_a_stale_step_counts_s_times_over_the_raw_weights():
    algorithm, global_ = _cloud({**ASYNC, "staleness": {"function": "polynomial", "exponent": 1.0}})
    contributions = [_contribution(0, 5, 1.0, 4), _contribution(1, 2, 3.0, 2)]  # τ = 0 and 3: s = 1 and 1/4
    outcome = run_cloud_round(algorithm, global_, contributions, {}, 5, evaluate=False)
    assert outcome.global_[MODEL]["w"].tolist() == pytest.approx([(4 * 1.0 + 2 * 3.0 / 4) / 6] * 2, rel=1e-6)
    at = datetime.now(timezone.utc)
    record = round_record(5, contributions, outcome, at, at, at)
    assert [(c.edge_id, c.staleness, c.staleness_weight, c.dropped) for c in record.contributions] == \
        [(0, 0, 1.0, False), (1, 3, 0.25, False)]


def test_a_contribution_staler_than_the_maximum_is_dropped_and_recorded():
    algorithm, global_ = _cloud({**ASYNC, "staleness": {"max": 2}})
    contributions = [_contribution(0, 5, 1.0, 4), _contribution(1, 2, 3.0, 2)]
    outcome = run_cloud_round(algorithm, global_, contributions, {}, 5, evaluate=False)
    assert outcome.global_[MODEL]["w"].tolist() == pytest.approx([1.0, 1.0])  # edge 0's step alone, over its weight
    at = datetime.now(timezone.utc)
    record = round_record(5, contributions, outcome, at, at, at)
    assert [(c.edge_id, c.dropped) for c in record.contributions] == [(0, False), (1, True)]
    assert [c.client_id for c in record.clients] == [0]  # the dropped one's clients are not in the model
    everything = run_cloud_round(algorithm, global_, contributions[1:], {}, 5, evaluate=False)
    assert torch.equal(everything.global_[MODEL]["w"], global_[MODEL]["w"])  # all dropped: the model stays


def test_the_reference_replays_buffered_averaging_in_virtual_time_deterministically():
    config = RunConfig(**SMALL, rounds=6, topology={**ASYNC, "staleness": {"max": 1}})
    slow = {2: 2.5}
    first, again = run_reference(config, edge_slowdown=slow), run_reference(config, edge_slowdown=slow)
    schedule = [[(c.edge_id, c.base_version, c.dropped) for c in h.contributions] for h in first.history]
    # Edges 0 and 1 take 1 unit a round and restart at once on the version their step made; edge 2 (2.5 units)
    # arrives at t = 2.5 on version 0 and is consumed with edge 0's (t = 3) by update 2: τ = 2 > max, dropped.
    # It restarts on version 3 (t = 3), arrives at t = 5.5, and is consumed by update 5: dropped again.
    assert schedule == [[(0, 0, False), (1, 0, False)], [(0, 1, False), (1, 1, False)],
                        [(2, 0, True), (0, 2, False)], [(1, 2, False), (0, 3, False)],
                        [(0, 4, False), (1, 4, False)], [(2, 3, True), (0, 5, False)]]
    # Each update when its last contribution came in; 2 tasks per edge round, 3 edge rounds set at the start and
    # 2 more after each update.
    assert first.virtual_times == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    assert first.client_tasks == [6, 10, 14, 18, 22, 26]
    for name, t in first.global_state.items():
        assert torch.equal(t, again.global_state[name])


def test_the_reference_times_edge_rounds_by_their_slowest_modelled_device():
    from tests.federation.test_buffered import CONFIG, SLOW_DEVICE, SLOW_SITE

    config = CONFIG.model_copy(update={"rounds": 8})
    per_edge = {e: max(device_seconds(config, k, 1) for k in config.clients_of_edge(e)) for e in range(3)}
    assert per_edge[1] < per_edge[SLOW_DEVICE] < per_edge[SLOW_SITE]  # per sample: Pi 4 < XU4 LITTLE < Zero 2 W
    result = run_reference(config, device_time=True)
    by_edge = {e: [c.staleness for h in result.history for c in h.contributions if c.edge_id == e] for e in range(3)}
    # Edge 1, the fast site, is in every update, mostly fresh (never more than one version behind: one update may
    # come between its arrival and its consumption); the slow site arrives a few versions late each time.
    assert len(by_edge[1]) == config.rounds and max(by_edge[1]) <= 1
    assert by_edge[SLOW_SITE] and min(by_edge[SLOW_SITE]) >= 1
    assert len(by_edge[SLOW_SITE]) <= len(by_edge[SLOW_DEVICE]) < len(by_edge[1])


def test_an_edge_round_closing_at_k_answers_takes_the_k_of_least_modelled_time():
    config = RunConfig(**SMALL, policy={"answers": 2},
                       dvfs={"clients": {0: {"profile": "rpi-zero-2w"}, 3: {"profile": "odroid-xu4-a7"}}})
    results = [ClientResult(k, n, 0.0, {}) for k, n in ((0, 10), (1, 10), (2, 30), (3, 5), (4, 10))]
    # Per sample: Pi 4 3.7 ms, XU4 LITTLE 9.9 ms, Zero 2 W 11.5 ms: clients 1 and 4 (37 ms, ties by id) lead 3
    # (50 ms), 2 (112 ms) and 0 (115 ms).
    assert [r.client_id for r in first_answers(config, results)] == [1, 4]
    everyone = [0, 1, 2, 3, 4]
    assert [r.client_id for r in first_answers(RunConfig(**SMALL, policy={"answers": 9}), results)] == everyone
    assert [r.client_id for r in first_answers(RunConfig(**SMALL), results)] == everyone


def test_an_edge_round_needs_at_least_one_answer():
    with pytest.raises(ValidationError, match="greater than or equal to 1"):
        RunConfig(**SMALL, policy={"answers": 0})
