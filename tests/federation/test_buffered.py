"""Buffered asynchronous averaging (FedBuff) at the cloud through the services: FedAvg over 3 edges with a buffer
of B = 2, emulated devices: edge 2 a slow site (its devices Raspberry Pi Zero 2 Ws, 3× a Pi 4's time) and
client 0, at edge 0, a slow device (an ODROID-XU4's LITTLE core among Pi 4s). Which contributions each update
consumes is the services' timing; given that schedule, every update, with each contribution's staleness weight,
and the model are the reference runner's. (A cloud killed mid-run: tests/integration/test_buffered_services.py.)"""
import pytest

from fl_services.shared.core.config import RunConfig
from fl_services.shared.core.reference import schedule_of
from fl_services.shared.core.reports import RoundRecord
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


def consumed(history) -> list[list[tuple[int, int, float, bool]]]:
    return [[(c.edge_id, c.base_version, round(c.staleness_weight, 12), c.dropped) for c in h.contributions]
            for h in history]


async def run_and_replay(storage, tmp_path, config: RunConfig) -> list[RoundRecord]:
    """The run's history through the services, once checked equal to the reference replaying its buffers."""
    async with federation(storage, tmp_path, num_clients=9, num_edges=3, procs_per_edge=1,
                          client={"dvfs_backend": "emulate"}) as fed:
        # A first run loads every client's data and model: in the measured run, the emulated times set the pace
        # from its first round on (a device's first task would otherwise take its loading time, whatever its speed).
        await run(fed.admin, config.model_copy(update={"name": "warm-up", "rounds": 1}), timeout_s=300)
        _, history, model = await run(fed.admin, config, timeout_s=300)
    expected = await reference(config, schedule=schedule_of(history))
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
