"""Secure aggregation at the edge through the services (edge/secagg.py, client/secagg.py): the model equals plain
FedAvg within the fixed-point precision, a device dropping after key sharing is recovered, the edge sees no update
in the clear, and malformed shares make the round fail instead of giving a wrong sum."""
from __future__ import annotations

import asyncio
import logging

import numpy as np
import pytest
import torch

from fl_services.client.secagg import RoundOver, SecureUpload
from fl_services.edge.tasks import TaskBoard
from fl_services.shared.core.config import RunConfig
from fl_services.shared.core.records import decode
from fl_services.shared.core.reference import InProcessClients
from fl_services.shared.core.reports import EdgeContributionHeader, RunStatus
from fl_services.shared.core.secagg import fixedpoint, shamir, sites
from fl_services.shared.core.secagg.protocol import DeviceSession
from tests.federation import harness
from tests.federation.checks import assert_same_federated, assert_within_fixed_point, reference, run
from tests.federation.harness import federation
from tests.federation.test_buffered import SLOW
from tests.federation.test_selected import FAST, TWO_SITES, selected

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


@pytest.mark.parametrize("overrides", [
    {},
    {"algorithm": "fedprox", "params": {"mu": 0.1}},
    # DP-FedAvg with each device noising its own step: the edge never holds an unnoised update, nor a single one.
    {"privacy": {"noise": "client", "clip_norm": 1.0, "noise_multiplier": 0.5}, "weighting": "uniform"},
])
async def test_the_model_equals_plain_fedavg_within_the_fixed_point_bound(fed, overrides):
    config = secure_config(**overrides)
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


async def test_a_round_below_the_threshold_fails_and_is_run_again(fed, monkeypatch, caplog):
    """Three of five devices drop after sharing in the first attempt: two masked inputs are fewer than t = 3, so the
    round fails (no sum is submitted) and the edge runs it again, where everyone stays."""
    post = SecureUpload._post
    first: set[str] = set()

    async def three_drop_once(self, step, **body):
        if step == "masked" and self.task.client_id >= 2 and self.task.client_id not in first:
            first.add(self.task.client_id)
            await asyncio.sleep(self.task.config.secure_aggregation.phase_timeout_s + 1)
            raise RoundOver("gone for this attempt")
        await post(self, step, **body)

    monkeypatch.setattr(SecureUpload, "_post", three_drop_once)
    caplog.set_level(logging.WARNING)
    config = secure_config()
    _, history, model = await run(fed.admin, config)
    assert first == {2, 3, 4}
    assert "only 2 devices sent masked inputs; secure aggregation needs 3" in caplog.text
    assert [c.client_id for c in history[0].clients] == [0, 1, 2, 3, 4]
    assert_within_fixed_point(model, (await reference(config)).global_state, config)


async def test_keys_after_the_deadline_join_while_the_edge_waits_again_for_its_quorum(fed, monkeypatch):
    """policy.min_fraction 1 with retries: device 4 sends its keys (its answer) only once a deadline of the edge's
    has passed with the four others in; as a round in the clear would, the edge waits again for the quorum and
    sums all five devices, instead of closing the roster at four."""
    first_deadline = asyncio.Event()
    wait_results = TaskBoard.wait_results

    async def noted(self, *args, **kwargs):
        answered = await wait_results(self, *args, **kwargs)
        if len(answered) == 4:  # device 4 is held back: the wait ended at its deadline
            first_deadline.set()
        return answered

    post = SecureUpload._post

    async def late_keys(self, step, **body):
        if step == "keys" and self.task.client_id == 4:
            await first_deadline.wait()
        await post(self, step, **body)

    monkeypatch.setattr(TaskBoard, "wait_results", noted)
    monkeypatch.setattr(SecureUpload, "_post", late_keys)
    config = secure_config(policy={"deadline_s": 5.0, "min_fraction": 1.0, "max_retries": 3})
    _, history, model = await run(fed.admin, config)
    assert first_deadline.is_set()
    assert [c.client_id for c in history[0].clients] == [0, 1, 2, 3, 4]
    assert_within_fixed_point(model, (await reference(config)).global_state, config)


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
    """The network, recording every request's path and body."""

    bodies: list[tuple[str, bytes]] = []

    async def handle_async_request(self, request):
        Recorder.bodies.append((request.url.path, await request.aread()))
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
    received = b"".join(body for path, body in Recorder.bodies if path.startswith("/api/v1/clients"))
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




def cloud_config(**overrides) -> RunConfig:
    return secure_config(**{"data": {"num_clients": 6}, "topology": {"num_edges": 2},
                            "secure_aggregation": {"cloud": True, "scale_bits": FRACTIONAL_BITS}, **overrides})


@pytest.mark.parametrize("edge", [False, True])
async def test_the_cloud_sees_only_the_sum_over_the_sites(cloud_storage, tmp_path, monkeypatch, caplog, edge):
    """The cloud unmasks only the sites' total (and with secure aggregation at the edges too, each edge only its
    devices' sum, all 3 of its devices' masked inputs in); the model equals plain FedAvg within the fixed-point
    bound."""
    monkeypatch.setattr(harness, "Wire", Recorder)
    Recorder.bodies = []
    caplog.set_level(logging.INFO, logger="fl_services.edge")
    config = cloud_config(secure_aggregation={"cloud": True, "edge": edge, "scale_bits": FRACTIONAL_BITS})
    async with federation(cloud_storage, tmp_path, num_clients=6, num_edges=2) as fed:
        run_id, history, model = await run(fed.admin, config)
        keys = (await fed.admin.run(run_id)).config.secure_aggregation.site_keys  # relayed: public keys only
        assert keys is not None and sorted(keys) == [0, 1] and keys[0] != keys[1]
    assert sorted(c.client_id for c in history[0].clients) == list(range(6)) and history[0].edges == [0, 1]
    assert 0 < assert_within_fixed_point(model, (await reference(config)).global_state, config) <= 2.0 ** -9
    assert caplog.text.count("masked inputs from 3 of 3 devices") == (2 if edge else 0)
    submitted = [decode(body, EdgeContributionHeader) for path, body in Recorder.bodies
                 if path.endswith("/contributions")]
    assert sorted(header.edge_id for _, header in submitted) == [0, 1]
    for tensors, _ in submitted:  # one site's sum alone: words spread over the ring, nothing like a model step
        assert sites.is_masked(tensors)
        alone = fixedpoint.decode(tensors[sites.MASKED][sites.MASKED].numpy().view(np.uint64),
                                  [("model", "all", (tensors[sites.MASKED][sites.MASKED].numel(),))],
                                  FRACTIONAL_BITS, 64)
        assert float(alone["model"]["all"].abs().median()) > 1e12


@pytest.mark.parametrize(("tier", "overrides", "says"), [
    ("edge", {"aggregation": {"edge": "krum"}}, "needs every update at the edge"),
    ("edge", {"aggregation": {"edge": "median"}}, "needs every update at the edge"),
    ("edge", {"privacy": {"noise": "edge"}}, "privacy.noise = 'client'"),
    ("edge", {"algorithm": "scaffold"}, "needs each client's result at the edge"),
    ("edge", {"algorithm": "fedvarp"}, "needs each client's result at the edge"),
    ("edge", {"policy": {"answers": 1}}, "a sum of one device's update is that update"),
    ("cloud", {"topology": {"num_edges": 2, "buffer_size": 1}}, "buffered averaging would weigh each site"),
    ("cloud", {"aggregation": {"cloud": "median"}}, "needs each site's step"),
    ("cloud", {"algorithm": "fedvarp"}, "each site's at the cloud"),
])
async def test_what_secure_aggregation_cannot_protect_is_refused_with_422(fed, tier, overrides, says):
    config = secure_config() if tier == "edge" else cloud_config()
    response = await fed.cloud_request("POST", "/api/v1/runs", json={**config.model_dump(mode="json"), **overrides})
    assert response.status_code == 422, response.text
    assert says in response.text


async def test_both_tiers_over_registered_devices_with_federated_evaluation_equal_the_replay(cloud_storage, tmp_path):
    """Devices with ids of their own (101, 205, …) at two sites: each edge's protocol keys its roster, shares and
    weights by device id, the cloud's roster takes the members its masked contributions declare, and each device's
    evaluation of the version its task carries travels in clear with its masked update (a figure of the global
    model, not the update): the records are the replay's, the model within the fixed-point bound."""
    config = selected("secagg-devices", {
        "algorithm": "fedavg", "fraction": 1.0, "rounds": 1, "evaluation": "both",
        "secure_aggregation": {"edge": True, "cloud": True, "scale_bits": FRACTIONAL_BITS, "phase_timeout_s": 3.0}})
    async with federation(cloud_storage, tmp_path, num_clients=0, num_edges=2, devices=TWO_SITES, **FAST) as fed:
        info = await fed.admin.create_run(config)
        assert sorted(info.config.secure_aggregation.site_keys or {}) == [0, 1]
        await fed.admin.action(info.run_id, "start")
        assert (await fed.admin.wait(info.run_id)).status == RunStatus.finished
        [got] = await fed.admin.history(info.run_id)
        model = await fed.admin.model(info.run_id)
    want = await reference(info.config, devices=TWO_SITES)
    [ref] = want.history
    assert [(c.client_id, c.edge_id) for c in got.clients] == [(c.client_id, c.edge_id) for c in ref.clients]
    assert {c.client_id for c in got.clients} == {d.client_id for d in TWO_SITES}
    assert {c.edge_id: c.members for c in got.contributions} == {c.edge_id: c.members for c in ref.contributions}
    assert_same_federated(got, ref)
    assert all(c.evaluation is not None for c in got.clients)
    assert_within_fixed_point(model, want.global_state, info.config)


async def test_an_edge_closing_at_its_kth_answer_sums_those_k_devices_alone(cloud_storage, tmp_path):
    """policy.answers = 3 of 5 devices, two of them far slower (emulated): the protocol's roster is the three whose
    keys closed step 0, the slow two are refused and dropped as late answers are, and the model is the reference's
    (its K devices of least modelled time) within the fixed-point bound."""
    config = secure_config(name="secagg-k-of-n", policy={"answers": 3},
                           dvfs={"time_scale": 0.5, "clients": {3: SLOW, 4: SLOW}})
    async with federation(cloud_storage, tmp_path, num_clients=5, procs_per_edge=1,
                          client={"dvfs_backend": "emulate"}) as fed:
        # A first run loads every client's data and model, so that the emulated times set the pace.
        await run(fed.admin, config.model_copy(update={"name": "warm-up"}), timeout_s=300)
        _, history, model = await run(fed.admin, config, timeout_s=300)
    expected = await reference(config)
    assert [c.client_id for c in history[0].clients] == [c.client_id for c in expected.history[0].clients] == [0, 1, 2]
    assert_within_fixed_point(model, expected.global_state, config)
