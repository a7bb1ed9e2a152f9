"""Secure aggregation at the edge through the services (edge/secagg.py, client/secagg.py): the model equals plain
FedAvg within the fixed-point precision, a device dropping after key sharing is recovered, the edge sees no update
in the clear, and malformed shares make the round fail instead of giving a wrong sum."""
from __future__ import annotations

import asyncio
import logging

import pytest
import torch

from fl_services.client.secagg import SecureUpload
from fl_services.shared.core.config import RunConfig
from fl_services.shared.core.reference import InProcessClients
from fl_services.shared.core.reports import RunStatus
from fl_services.shared.core.secagg import shamir
from fl_services.shared.core.secagg.protocol import DeviceSession
from tests.federation import harness
from tests.federation.checks import assert_within_fixed_point, reference, run
from tests.federation.harness import federation

pytestmark = pytest.mark.anyio

FRACTIONAL_BITS = 8  # coarse on purpose: the fixed-point error is then visible, and the bound is what is tested


def secure_config(**overrides) -> RunConfig:
    fields = {"name": "secagg", "rounds": 1, "model": {"name": "logreg"}, "data": {"num_clients": 5},
              "secure_aggregation": {"edge": True, "scale_bits": FRACTIONAL_BITS, "phase_timeout_s": 3.0},
              **overrides}
    return RunConfig(**fields)


@pytest.fixture
async def fed(cloud_storage, tmp_path):
    async with federation(cloud_storage, tmp_path, num_clients=5) as fed:
        yield fed


async def test_the_model_equals_plain_fedavg_within_the_fixed_point_bound(fed):
    config = secure_config()
    _, history, model = await run(fed.admin, config)
    expected = await reference(config)  # the reference runner aggregates in the clear
    assert [c.client_id for c in history[0].clients] == [0, 1, 2, 3, 4]
    worst = assert_within_fixed_point(model, expected.global_state, config)
    # The error is there (the encoding is coarse), and within 2^-(f+1) per coordinate.
    assert 0 < worst <= 2.0 ** -(FRACTIONAL_BITS + 1)


class WithoutDevice(InProcessClients):
    """The reference's clients but one, whose result never arrives: FedAvg over the survivors."""

    dropped = 4

    async def train(self, tasks):
        return [r for r in await super().train(tasks) if r.client_id != self.dropped]


async def test_a_device_dropping_after_key_sharing_is_recovered_and_the_round_equals_fedavg_over_the_survivors(
        fed, monkeypatch):
    shared = asyncio.Event()
    post = SecureUpload._post

    async def drops_after_sharing(self, step, **body):
        if self.task.client_id == WithoutDevice.dropped and step == "masked":
            shared.set()
            await asyncio.Event().wait()  # gone: it never sends its masked input
        await post(self, step, **body)

    monkeypatch.setattr(SecureUpload, "_post", drops_after_sharing)
    config = secure_config()
    _, history, model = await run(fed.admin, config)
    assert shared.is_set()
    assert [c.client_id for c in history[0].clients] == [0, 1, 2, 3]
    expected = await reference(config, clients=WithoutDevice)
    assert_within_fixed_point(model, expected.global_state, config)
    everyone = await reference(config)
    assert any(not torch.allclose(model[n], t, atol=1e-3) for n, t in everyone.global_state.items())


class Updates(InProcessClients):
    """The reference's clients, keeping each one's update: what the edge must never see in the clear."""

    seen: dict[int, dict[str, torch.Tensor]] = {}

    async def train(self, tasks):
        results = await super().train(tasks)
        for r in results:
            Updates.seen[r.client_id] = r.tensors["model"]
        return results


def _windows(update: dict[str, torch.Tensor], config: RunConfig, weight: int) -> list[bytes]:
    """Byte strings that would betray `update` in the clear: 32 bytes of each tensor as float32 and float64 (as
    a result message carries it) and as the fixed-point words the device masks."""
    from fl_services.shared.core.secagg import fixedpoint
    sa = config.secure_aggregation
    words = fixedpoint.encode({"model": update}, weight, sa.clip, sa.scale_bits, sa.bits).tobytes()
    out = [words[8 * 16:8 * 20]]
    for t in update.values():
        flat = t.reshape(-1)
        out += [flat[:8].to(torch.float32).numpy().tobytes(), flat[:4].to(torch.float64).numpy().tobytes()]
    return out


class Recorder(harness.Wire):
    """The edge's side of the network, recording every request body it receives."""

    bodies: list[bytes] = []

    async def handle_async_request(self, request):
        Recorder.bodies.append(await request.aread())
        return await super().handle_async_request(request)


@pytest.mark.parametrize("secure", [False, True])
async def test_the_edge_stores_logs_and_receives_no_update_in_the_clear(cloud_storage, tmp_path, monkeypatch, caplog,
                                                                     secure):
    """With secure aggregation off, the same search finds every update: the search is able to see one."""
    monkeypatch.setattr(harness, "Wire", Recorder)
    Recorder.bodies = []
    caplog.set_level(logging.DEBUG)
    config = secure_config(secure_aggregation={"edge": secure, "scale_bits": FRACTIONAL_BITS})
    async with federation(cloud_storage, tmp_path, num_clients=5) as fed:
        await run(fed.admin, config)
    await reference(config, clients=Updates)
    received = b"".join(Recorder.bodies)
    stored = b"".join(p.read_bytes() for p in (tmp_path / "edge-state").rglob("*") if p.is_file())
    logged = caplog.text.encode()
    samples = {k: n for k, n in enumerate(InProcessClients(__import__(
        "fl_services.shared.core.algorithms.registry", fromlist=["create"]).create(config)).data.clients)}
    found = []
    for k, update in Updates.seen.items():
        weight = len(samples[k].train)
        for window in _windows(update, config, weight):
            found += [(k, where) for where, text in (("received", received), ("stored", stored), ("logged", logged))
                      if window in text]
    if secure:
        assert found == []
    else:
        assert {k for k, where in found if where == "received"} == set(Updates.seen)


async def test_malformed_shares_make_the_round_fail_never_a_wrong_sum(fed, monkeypatch, caplog):
    unmask = DeviceSession.unmask
    liar = 2

    def lies(self, remaining):
        s_shares, b_shares = unmask(self, remaining)
        if self.client_id == liar:  # well-formed field elements, but not its shares
            b_shares = {v: shamir.split(b"\x07" * 32, 2, [0, 1])[0] for v in b_shares}
        return s_shares, b_shares

    monkeypatch.setattr(DeviceSession, "unmask", lies)
    caplog.set_level(logging.WARNING)
    config = secure_config(rounds=1)
    info = await fed.admin.create_run(config)
    await fed.admin.action(info.run_id, "start")
    for _ in range(400):  # until the edge has refused the sum (and re-run the round) at least twice
        if caplog.text.count("a device sent malformed shares") >= 2:
            break
        await asyncio.sleep(0.05)
    assert caplog.text.count("a device sent malformed shares") >= 2
    assert (await fed.admin.run(info.run_id)).version == 0  # nothing submitted: no wrong sum reached the cloud
    monkeypatch.setattr(DeviceSession, "unmask", unmask)  # the device mends its ways: the re-run round completes
    final = await fed.admin.wait(info.run_id, timeout_s=120)
    assert final.status == RunStatus.finished
    assert_within_fixed_point(await fed.admin.model(info.run_id), (await reference(config)).global_state, config)


@pytest.mark.parametrize(("overrides", "says"), [
    ({"aggregation": {"edge": "krum"}}, "needs every update at the edge"),
    ({"aggregation": {"edge": "median"}}, "needs every update at the edge"),
    ({"privacy": {"noise": "edge"}}, "privacy.noise = 'client'"),
    ({"algorithm": "scaffold"}, "needs each client's result at the edge"),
    ({"algorithm": "fedvarp"}, "needs each client's result at the edge"),
])
async def test_a_run_that_needs_individual_updates_is_refused_with_422(fed, overrides, says):
    body = {**secure_config().model_dump(mode="json"), **overrides}
    response = await fed.cloud_request("POST", "/api/v1/runs", json=body)
    assert response.status_code == 422, response.text
    assert says in response.text
