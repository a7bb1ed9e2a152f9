"""Every algorithm of the catalogue over registered devices equals the reference runner replaying those devices.

The devices' ids are not 0 … N−1 (101, 205, …), each holds its own data source (a partition, as the simulation
workers name theirs) and labels, and the run selects them (`selection`) rather than naming a roster: server
memories are keyed by device id, N is the devices registered for the run, cluster maps and capacities name device
ids or labels. A device that registers mid-run is a member from the next round, and the memory-keeping algorithms
(SCAFFOLD's N and m, FedVARP's y_k, ClusterFedVARP's clusters) equal the reference that replays its join.
"""
import pytest

from fl_services.shared.core.config import RunConfig
from fl_services.shared.core.reference import Device, joins_of
from fl_services.shared.core.reports import RoundRecord, RunStatus
from tests.federation.checks import assert_same_model, reference
from tests.federation.harness import SITE_REPORT_S, Admin, federation
from tests.federation.test_catalogue import ANY_CLIENTS, SHORT_PFEDME
from tests.integration.test_hfpl_services import CONFIG as HFPL

pytestmark = pytest.mark.anyio

DATA = "partition:digits?clients=6&partitioner=dirichlet&alpha=0.5&index={}"
IDS = [101, 205, 333, 412, 517, 640]
# Labels group=a for 101, 333, 517 and group=b for 205, 412, 640: cluster maps may name them.
DEVICES = [Device(k, 0, DATA.format(i), {"group": "ab"[i % 2]}) for i, k in enumerate(IDS)]
FAST = {"cloud": {"admission_interval_s": 0.05}, "edge": {"site_report_s": SITE_REPORT_S}}
BASE = dict(model={"name": "mlp"}, data={"dataset": "digits", "num_clients": 6},
            local={"epochs": 2, "batch_size": 16, "lr": 0.05}, fraction=0.5, rounds=3)

CATALOGUE = {
    **ANY_CLIENTS,
    # 101 and the group=b devices in named clusters; 333 and 517 alone, each in a cluster of its own.
    "clusterfedvarp": {"params": {"clusters": {"101": 0, "group=b": 1}}},
    "fedrolex": {"params": {"capacities": {"101": 0.5, "640": 0.25}}},
    "fedscavar": {"params": {"mu": 0.1, "clusters": {"group=a": 0, "205": 1}}},
    "pfedme": SHORT_PFEDME,
    "hfpl": {**HFPL, "data": BASE["data"], "model": {"name": "mlp"}, "fraction": 1.0},
}


def selected(name: str, overrides: dict, min_devices: int = len(IDS)) -> RunConfig:
    fields = {**BASE, "name": name, "algorithm": name, "selection": {"sites": "all", "min_devices": min_devices}}
    return RunConfig.model_validate({**fields, **overrides})


async def finished(admin: Admin, run_id: str, rounds: int) -> list[RoundRecord]:
    final = await admin.wait(run_id, timeout_s=300)
    assert final.status == RunStatus.finished and final.version == rounds, final
    return await admin.history(run_id)


async def assert_equals_replay(admin: Admin, run_id: str, config: RunConfig, history: list[RoundRecord],
                               devices: list[Device]) -> None:
    """The run's clients, members, model and figures are the reference's, given its devices."""
    want = await reference(config, devices=devices)
    assert [[(c.client_id, c.edge_id) for c in h.clients] for h in history] == \
        [[(c.client_id, c.edge_id) for c in h.clients] for h in want.history]
    # A record lists its contributions in the order they arrived: by edge, the members each edge declared.
    assert [{c.edge_id: c.members for c in h.contributions} for h in history] == \
        [{c.edge_id: c.members for c in h.contributions} for h in want.history]
    assert_same_model(await admin.model(run_id), want.global_state)
    for got, ref in zip(history, want.history, strict=True):
        assert got.test_accuracy == pytest.approx(ref.test_accuracy, abs=3e-3)
        assert got.client_metrics == pytest.approx(ref.client_metrics, abs=1e-6)
        assert got.server_metrics == pytest.approx(ref.server_metrics, abs=1e-6)


@pytest.mark.parametrize("name", list(CATALOGUE))
async def test_every_algorithm_over_registered_devices_equals_the_reference(cloud_storage, tmp_path, name):
    async with federation(cloud_storage, tmp_path, num_clients=0, devices=DEVICES, **FAST) as fed:
        info = await fed.admin.create_run(selected(name, CATALOGUE[name]))
        assert info.config.selection is not None and info.config.selection.edge_ids == [0]
        await fed.admin.action(info.run_id, "start")
        history = await finished(fed.admin, info.run_id, info.config.rounds)
        await assert_equals_replay(fed.admin, info.run_id, info.config, history, DEVICES)
    assert all(c.members == IDS for h in history for c in h.contributions)
    assert {c.client_id for h in history for c in h.clients} <= set(IDS)


@pytest.mark.parametrize("name", ["scaffold", "fedvarp", "clusterfedvarp"])
async def test_a_device_joining_mid_run_grows_the_memories_as_the_reference_replays(cloud_storage, tmp_path, name):
    first, late = DEVICES[:4], DEVICES[4:]
    config = selected(name, {**CATALOGUE[name], "rounds": 5}, min_devices=len(first))
    async with federation(cloud_storage, tmp_path, num_clients=0, devices=first, **FAST) as fed:
        info = await fed.admin.create_run(config)
        await fed.admin.action(info.run_id, "start")
        await fed.admin.wait_version(info.run_id, 1)
        for device in late:
            await fed.join(device)
        history = await finished(fed.admin, info.run_id, config.rounds)
        joins = joins_of(history)
        # Members from a round after the first: the one after the round each registered during.
        assert {joins[d.client_id] for d in first} == {0}
        assert all(1 <= joins[d.client_id] < config.rounds for d in late), joins
        devices = first + [Device(d.client_id, d.edge_id, d.data, d.labels, joins[d.client_id]) for d in late]
        await assert_equals_replay(fed.admin, info.run_id, info.config, history, devices)


# Two sites: 101, 333, 517 register at edge 0, 205, 412, 640 at edge 1.
TWO_SITES = [Device(k, i % 2, DATA.format(i), {"group": "ab"[i % 2]}) for i, k in enumerate(IDS)]
OVER_TWO_SITES = {
    "scaffold": {},
    # DP-FedAvg with noise at each edge: seeded by the edge (not by k mod L), ε accounted at q = 1.
    "fedavg-edge-noise": {"algorithm": "fedavg", "weighting": "uniform",
                          "privacy": {"noise": "edge", "clip_norm": 1.0, "noise_multiplier": 0.05}},
    # An edge-level robust aggregator, and one device's own DVFS model named by its id.
    "fedprox-edge-median": {"algorithm": "fedprox", "fraction": 1.0, "aggregation": {"edge": "median"},
                            "dvfs": {"clients": {640: {"profile": "jetson-nano"}}}},
}


@pytest.mark.parametrize("name", list(OVER_TWO_SITES))
async def test_two_sites_with_privacy_robust_aggregation_and_dvfs_by_device_equal_the_reference(
        cloud_storage, tmp_path, name):
    config = selected(name, OVER_TWO_SITES[name])
    async with federation(cloud_storage, tmp_path, num_clients=0, num_edges=2, devices=TWO_SITES, **FAST) as fed:
        info = await fed.admin.create_run(config)
        assert info.config.selection is not None and info.config.selection.edge_ids == [0, 1]
        await fed.admin.action(info.run_id, "start")
        history = await finished(fed.admin, info.run_id, config.rounds)
        await assert_equals_replay(fed.admin, info.run_id, info.config, history, TWO_SITES)
    want = await reference(info.config, devices=TWO_SITES)
    assert [h.epsilon for h in history] == [h.epsilon for h in want.history]
    # Each device is recorded at the site it registered at.
    site = {d.client_id: d.edge_id for d in TWO_SITES}
    assert all(c.edge_id == site[c.client_id] for h in history for c in h.clients)


@pytest.mark.parametrize(("overrides", "says"), [
    ({"algorithm": "fedavg", "privacy": {"dp_sgd_noise_multiplier": 1.0}}, "takes no DP-SGD"),
    ({"algorithm": "clusterfedvarp", "params": {"clusters": [0, 0, 1, 1, 0, 1]}}, "by device id or label"),
    ({"algorithm": "clusterfedvarp"}, "by device id or label"),
    ({"algorithm": "fedrolex", "params": {"capacities": [1, 1, 1, 1, 1, 1]}}, "capacities by device id"),
    ({"algorithm": "clusterfedvarp", "params": {"clusters": {"paris": 0}}}, "neither a device id nor a label"),
    ({"algorithm": "fedavg", "topology": {"num_edges": 2, "buffer_size": 1}}, "takes a simulated federation"),
])
async def test_what_a_run_over_registered_devices_cannot_take_is_refused_saying_why(cloud_storage, tmp_path,
                                                                                    overrides, says):
    async with federation(cloud_storage, tmp_path, num_clients=0, devices=DEVICES[:1], **FAST) as fed:
        body = {**BASE, **overrides, "selection": {"sites": "all"}}
        response = await fed.admin.http.post("/api/v1/runs", json=body)
    assert response.status_code == 422, response.text
    assert says in response.text


async def test_a_device_registered_at_two_sites_is_one_member_held_by_the_first_site_to_declare_it(
        cloud_storage, tmp_path):
    """Device 7's token is taken at both sites, and both register it: the cloud refuses the second site's
    contribution declaring it (409 naming the site that holds it), that site re-runs its round without it, and
    every round trains 7 once, at one site, whose members alone list it: N counts it once."""
    devices = [*TWO_SITES[:2], Device(7, 0, DATA.format(2)), Device(7, 1, DATA.format(2))]
    config = selected("fedavg", {"rounds": 3, "fraction": 1.0}, min_devices=len(devices))
    async with federation(cloud_storage, tmp_path, num_clients=0, num_edges=2, devices=devices, **FAST) as fed:
        info = await fed.admin.create_run(config)
        await fed.admin.action(info.run_id, "start")
        history = await finished(fed.admin, info.run_id, config.rounds)
    holders = {c.edge_id for h in history for c in h.contributions if 7 in (c.members or [])}
    assert len(holders) == 1, holders
    for h in history:
        assert [c.client_id for c in h.clients].count(7) == 1, h.clients
        assert sum((c.members or []).count(7) for c in h.contributions) == 1
