"""The budgets an edge puts in its tasks: the deadline of its slowest client, plus the buffer's slack."""
from fl_services.edge.pacing import EdgePacing
from fl_services.shared.core.algorithms.base import ClientResult
from fl_services.shared.core.config import RunConfig
from fl_services.shared.core.reports import DeviceReport
from fl_services.shared.wire.edge_cloud import GlobalStateHeader


def result(client_id: int, full_speed_s: float, took_s: float) -> ClientResult:
    device = DeviceReport(backend="emulated", profile="rpi4", policy="slack", frequencies_ghz=[1.5], compute_s=took_s,
                          comm_s=0.0, energy_j=1.0, full_speed_s=full_speed_s)
    return ClientResult(client_id, 10, 0.5, {}, {}, device)


def config(policy: str, **dvfs) -> RunConfig:
    return RunConfig(topology={"num_edges": 2, "buffer_size": 2}, dvfs={"policy": policy, **dvfs})


def header(cfg: RunConfig, waits: dict[int, float], run_id: str = "r") -> GlobalStateHeader:
    return GlobalStateHeader(run_id=run_id, version=1, config=cfg, buffer_waits=waits)


def test_deadline_is_the_slowest_selected_client_at_full_speed_once_all_reported():
    cfg, pacing = config("deadline"), EdgePacing(0)
    pacing.heard(header(cfg, {}))
    assert pacing.budget(cfg, [0, 2]) is None  # nobody reported yet: full speed
    pacing.observe(cfg, [0, 2], [result(0, 10.0, 10.0), result(2, 30.0, 30.0)])
    assert pacing.budget(cfg, [0, 2]) == 30.0
    assert pacing.budget(cfg, [0]) == 10.0
    assert pacing.budget(cfg, [0, 4]) is None  # a client not heard from yet
    assert pacing.budget(config("max"), [0, 2]) is None
    assert pacing.budget(config("deadline", deadline_s=50.0), [0, 4]) == 50.0


def test_slack_adds_the_buffer_wait_and_keeps_it_once_the_clients_absorb_it():
    cfg, pacing = config("slack", time_scale=0.5), EdgePacing(0)
    pacing.heard(header(cfg, {}))
    pacing.observe(cfg, [0, 2], [result(0, 10.0, 10.0), result(2, 30.0, 30.0)])
    pacing.heard(header(cfg, {0: 6.0, 1: 0.0}))  # waited 6 s of wall time: 12 modelled seconds
    assert pacing.budget(cfg, [0, 2]) == 42.0
    assert pacing.budget(config("deadline", time_scale=0.5), [0, 2]) == 30.0
    # The clients took the budget and the contribution no longer waited: the slack stays 12, not 0 (which
    # would make them race, wait, and slow down again, round after round).
    pacing.observe(cfg, [0, 2], [result(0, 10.0, 40.0), result(2, 30.0, 42.0)])
    pacing.heard(header(cfg, {0: 0.0}))
    assert pacing.budget(cfg, [0, 2]) == 42.0
    # Part of it absorbed (36 of 42 s) and 1 s (2 modelled) waited: 6 + 2 = 8.
    pacing.observe(cfg, [0, 2], [result(0, 10.0, 30.0), result(2, 30.0, 36.0)])
    pacing.heard(header(cfg, {0: 1.0}))
    assert pacing.budget(cfg, [0, 2]) == 38.0
    pacing.heard(header(cfg, {1: 3.0}))  # another edge's wait: nothing learnt
    assert pacing.budget(cfg, [0, 2]) == 38.0
    pacing.heard(header(cfg, {}, run_id="next"))  # a new run starts afresh
    assert pacing.budget(cfg, [0, 2]) is None and pacing.slack_s == 0.0


def test_slack_given_back_when_the_edge_arrives_last():
    """An edge that slowed down until its contribution came last (a negative wait: it lagged the others by
    that much) gives back what it lagged by; before, its slack could only grow, and slack runs drifted slower."""
    cfg, pacing = config("slack"), EdgePacing(0)
    pacing.heard(header(cfg, {}))
    pacing.observe(cfg, [0], [result(0, 10.0, 10.0)])
    pacing.heard(header(cfg, {0: 5.0}))
    assert pacing.budget(cfg, [0]) == 15.0
    pacing.observe(cfg, [0], [result(0, 10.0, 15.0)])
    pacing.heard(header(cfg, {0: -2.0}))  # it used its 5 s and came 2 s after the others
    assert pacing.budget(cfg, [0]) == 13.0
    pacing.observe(cfg, [0], [result(0, 10.0, 13.0)])
    pacing.heard(header(cfg, {0: -4.0}))  # the others sped up: it is the critical path now
    assert pacing.budget(cfg, [0]) == 10.0
