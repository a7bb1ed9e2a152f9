"""Buffered asynchronous averaging (FedBuff) at the cloud through the services: FedAvg over 3 edges with a buffer
of B = 2, emulated devices: edge 2 a slow site (its devices Raspberry Pi Zero 2 Ws, 3× a Pi 4's time) and
client 0, at edge 0, a slow device (an ODROID-XU4's LITTLE core among Pi 4s). Which contributions each update
consumes is the services' timing; given that schedule, every update, with each contribution's staleness weight,
and the model are the reference runner's. (A cloud killed mid-run: tests/integration/test_buffered_services.py.)"""
import pytest

from fl_services.shared.core.config import RunConfig
from fl_services.shared.core.reference import schedule_of
from tests.federation.checks import assert_same_model, reference, run
from tests.federation.harness import federation

pytestmark = pytest.mark.anyio

SLOW_SITE, SLOW_DEVICE = 2, 0
CONFIG = RunConfig(name="fedbuff", rounds=12, seed=5, model={"name": "logreg"},
                   data={"dataset": "digits", "num_clients": 9}, local={"lr": 0.1},
                   topology={"num_edges": 3, "buffer_size": 2, "staleness": {"max": 4}},
                   # A modelled second is 0.5 s: the emulated devices, not the computation, set the pace.
                   dvfs={"time_scale": 0.5, "clients": {SLOW_DEVICE: {"profile": "odroid-xu4-a7"},
                                                        **{k: {"profile": "rpi-zero-2w"} for k in (2, 5, 8)}}})


def consumed(history) -> list[list[tuple[int, int, float, bool]]]:
    return [[(c.edge_id, c.base_version, round(c.staleness_weight, 12), c.dropped) for c in h.contributions]
            for h in history]


async def test_buffered_averaging_with_a_slow_site_and_a_slow_device_equals_the_reference(cloud_storage, tmp_path):
    async with federation(cloud_storage, tmp_path, num_clients=9, num_edges=3, procs_per_edge=1,
                          client={"dvfs_backend": "emulate"}) as fed:
        _, history, model = await run(fed.admin, CONFIG, timeout_s=300)
    assert all(len(h.contributions) == 2 for h in history)
    stale = [c for h in history for c in h.contributions if c.staleness > 0]
    assert stale and all(c.staleness_weight < 1 or c.dropped for c in stale)  # the order mattered
    assert any(c.edge_id == SLOW_SITE for c in stale)
    expected = await reference(CONFIG, schedule=schedule_of(history))
    assert consumed(history) == consumed(expected.history)
    assert_same_model(model, expected.global_state, atol=1e-6)
    for got, want in zip(history, expected.history, strict=True):
        assert [(c.client_id, c.edge_id) for c in got.clients] == [(c.client_id, c.edge_id) for c in want.clients]
        assert got.test_accuracy == pytest.approx(want.test_accuracy, abs=1e-6)
