"""Buffered asynchronous averaging (FedBuff) at the cloud through the services: FedAvg over 3 edges with a buffer
of B = 2, emulated devices: edge 2 a slow site (its devices Raspberry Pi Zero 2 Ws, 3× a Pi 4's time) and
client 0, at edge 0, a slow device (an ODROID-XU4's LITTLE core among Pi 4s). Which contributions each update
consumes is the services' timing; given that schedule, every update, with each contribution's staleness weight,
and the model are the reference runner's. (A cloud killed mid-run: tests/integration/test_buffered_services.py.)"""
import pytest
import torch

from fl_services.cloud.services.contributions import check_contribution
from fl_services.shared.core import late
from fl_services.shared.core.algorithms import registry
from fl_services.shared.core.algorithms.base import MODEL
from fl_services.shared.core.config import RunConfig
from fl_services.shared.core.federation import initial_model
from fl_services.shared.core.reference import joined_of, schedule_of
from fl_services.shared.core.reports import ClientParticipation, EdgeContributionHeader, LatePart, RoundRecord
from fl_services.shared.core.tensors import InvalidContent
from tests.federation.checks import assert_same_model, reference, run
from tests.federation.harness import federation

pytestmark = pytest.mark.anyio

SLOW_SITE, SLOW_DEVICE = 2, 0
SETTINGS = dict(rounds=12, seed=5, model={"name": "logreg"}, data={"dataset": "digits", "num_clients": 9},
                local={"lr": 0.1}, topology={"num_edges": 3, "buffer_size": 2, "staleness": {"max": 4}})
# A modelled second is 0.5 s: the emulated devices, not the computation, set the pace.
CONFIG = RunConfig(name="fedbuff", **SETTINGS,
                   dvfs={"time_scale": 0.5, "clients": {SLOW_DEVICE: {"profile": "odroid-xu4-a7"},
                                                        **{k: {"profile": "rpi-zero-2w"} for k in (2, 5, 8)}}})
# Both tiers: each edge closes its round at the second of its three devices' answers (policy.answers = 2). Each
# edge holds one device far slower than its other two, whose late answer is dropped every round; the slow site's
# devices are all slower than the others'. The two answers an edge takes are thus its fast devices', whatever the
# machine's load, as the reference's modelled times say.
SLOW = {"profile": "rpi-zero-2w", "cycles_per_sample": 4e7}  # 4.6× a Pi 4's time per sample
BOTH_TIERS = RunConfig(name="fedbuff-both-tiers", **SETTINGS, policy={"answers": 2},
                       dvfs={"time_scale": 0.5, "clients": {0: SLOW, 4: SLOW, 8: {**SLOW, "cycles_per_sample": 8e7},
                                                            2: {"profile": "rpi-zero-2w"},
                                                            5: {"profile": "rpi-zero-2w"}}})

# Late answers join (policy.late = 'join'): as BOTH_TIERS, but client 0 is a Pi Zero 2 W (3× a Pi 4's time), whose
# late answer comes a version or two later and joins a later round of its edge, weighed by its own staleness; the
# other edges' slow devices' answers come many versions later (dropped beyond staleness.max). A modelled second is a
# second here: the devices' processes train their tasks one after another, which must not reorder the answers.
# Which round each late answer joins is the services' timing, which the reference replays.
LATE_JOIN = RunConfig(name="fedbuff-late-join", **SETTINGS, policy={"answers": 2, "late": "join"},
                      dvfs={"time_scale": 1.0, "clients": {**BOTH_TIERS.dvfs.model_dump()["clients"],
                                                           0: {"profile": "rpi-zero-2w"}}})


def consumed(history) -> list[list[tuple[int, int, float, bool]]]:
    return [[(c.edge_id, c.base_version, round(c.staleness_weight, 12), c.dropped, c.joined, c.clients)
             for c in h.contributions] for h in history]


async def run_and_replay(storage, tmp_path, config: RunConfig) -> list[RoundRecord]:
    """The run's history through the services, once checked equal to the reference replaying its buffers."""
    async with federation(storage, tmp_path, num_clients=9, num_edges=3, procs_per_edge=1,
                          client={"dvfs_backend": "emulate"}) as fed:
        # A first run loads every client's data and model: in the measured run, the emulated times set the pace
        # from its first round on (a device's first task would otherwise take its loading time, whatever its speed).
        await run(fed.admin, config.model_copy(update={"name": "warm-up", "rounds": 1}), timeout_s=300)
        _, history, model = await run(fed.admin, config, timeout_s=300)
    joins = joined_of(history) if config.policy.late == "join" else None
    expected = await reference(config, schedule=schedule_of(history), joined=joins)
    assert consumed(history) == consumed(expected.history)
    assert_same_model(model, expected.global_state, atol=1e-6)
    for got, want in zip(history, expected.history, strict=True):
        assert [(c.client_id, c.edge_id) for c in got.clients] == [(c.client_id, c.edge_id) for c in want.clients]
        assert got.test_accuracy == pytest.approx(want.test_accuracy, abs=1e-6)
    return history


async def test_buffered_averaging_with_a_slow_site_and_a_slow_device_equals_the_reference(cloud_storage, tmp_path):
    history = await run_and_replay(cloud_storage, tmp_path, CONFIG)
    assert all(len(h.contributions) == 2 for h in history)
    stale = [c for h in history for c in h.contributions if c.staleness > 0]
    assert stale and all(c.staleness_weight < 1 or c.dropped for c in stale)  # the order mattered
    assert any(c.edge_id == SLOW_SITE for c in stale)


async def test_buffered_averaging_at_both_tiers_equals_the_reference(cloud_storage, tmp_path):
    history = await run_and_replay(cloud_storage, tmp_path, BOTH_TIERS)
    assert {c.client_id for h in history for c in h.clients} == {1, 2, 3, 5, 6, 7}  # the slow three never count
    assert all(len(h.clients) == 4 for h in history)
    assert any(c.staleness > 0 for h in history for c in h.contributions)


async def test_late_answers_joining_the_next_edge_round_equal_the_reference(cloud_storage, tmp_path):
    history = await run_and_replay(cloud_storage, tmp_path, LATE_JOIN)
    joined = [(h.round, c) for h in history for c in h.contributions if c.joined]
    assert joined  # a slow device's answer came after its round closed, and counted in a later one
    for update, c in joined:
        assert c.staleness > 0 and c.clients and set(c.clients) <= {0, 4, 8}
        carrier = [o for o in history[update].contributions if o.edge_id == c.edge_id and not o.joined]
        assert carrier and carrier[0].base_version > c.base_version
    counted = {k for h in history for k in (c.client_id for c in h.clients)}
    assert counted & {0, 4, 8}  # late work is not wasted, as it is with the drop policy


def test_the_cloud_takes_late_parts_only_as_a_join_run_lists_them():
    algorithm = registry.create(LATE_JOIN)
    global_ = algorithm.init_global(initial_model(LATE_JOIN))
    step = algorithm.to_wire({MODEL: {name: torch.zeros_like(t, dtype=torch.float64)
                                      for name, t in global_[MODEL].items()}})

    def clients(*ids):
        return [ClientParticipation(client_id=k, num_samples=10, loss=0.5) for k in ids]

    def header(parts, run=LATE_JOIN, base=3):
        return EdgeContributionHeader(run_id="r", edge_id=0, base_version=base, idempotency_key="k", weight=20.0,
                                      clients=clients(3, 6), late=parts)

    def tensors(*versions):
        return {**step, **{f"{MODEL}@{v}": step[MODEL] for v in versions}}

    good = header([LatePart(base_version=1, weight=10.0, clients=clients(0))])
    check_contribution(algorithm, global_, good, tensors(1))
    parts = late.contributions(LATE_JOIN, good, tensors(1))
    assert [(c.base_version, c.joined, c.clients, c.weight) for c in parts] == [(3, False, (3, 6), 20.0),
                                                                                (1, True, (0,), 10.0)]
    refusals = [
        (registry.create(BOTH_TIERS), good, tensors(1), "drops late answers"),
        (algorithm, header([LatePart(base_version=3, weight=10.0, clients=clients(0))]), tensors(3), "earlier round"),
        (algorithm, good, tensors(1, 2), "no late part the header lists"),
        (algorithm, good, tensors(), "expected"),  # its tensors missing: the algorithm's spec says which
        (algorithm, header([LatePart(base_version=1, weight=10.0, clients=clients(3))]), tensors(1), "at most once"),
        (algorithm, header([LatePart(base_version=1, weight=99.0, clients=clients(0))]), tensors(1), "weight 99"),
        (algorithm, header([LatePart(base_version=1, weight=10.0, clients=clients(1))]), tensors(1), "not its clients"),
    ]
    for refusing, message, blob, why in refusals:
        with pytest.raises(InvalidContent, match=why):
            check_contribution(refusing, global_, message, blob)
