"""A federation of devices on hosts of their own: two sites (edges with names and labels, each in its network
namespace) and five devices (fl-client processes, each in its network namespace with a token of its own, bound to
its site, and data files of its own written here: an image folder, a CSV, the rest npz; none a partition of a
shared data set), all on one LAN with the operator's machine, where Redis and the cloud run. A run over both sites
refuses the device whose samples have the wrong shape (its reason read back over REST) and takes a device that
joins mid-run from its next round; a second run selects one site by label; a third is evaluated by the devices on
their own held-out splits.

Needs root and iproute2 (CI has both); skipped where a network namespace cannot be made. Every wait is bounded."""
from __future__ import annotations

import math
import os
import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from fl_services.fedctl.api import CloudAPI
from fl_services.fedctl.launch import LocalTopology, Service
from fl_services.shared.core.config import RunConfig
from fl_services.shared.core.data.sources import open_source
from fl_services.shared.core.federation import initial_model
from fl_services.shared.core.reports import HeldOut, RunStatus
from fl_services.shared.core.training import evaluate
from fl_services.shared.wire.admin import DeviceInfo
from fl_services.shared.wire.protocol import issue_device_tokens
from tests.federation.test_sites_and_devices import SITES as SITE_SETTINGS
from tests.federation.test_sites_and_devices import TASK, csv_file, image_folder, npz_file
from tests.integration.lan import Lan, lan

pytestmark = pytest.mark.slow

EDGE_PORT = 8100  # every edge listens on it, on its own host's address
SITE_OF = {0: "lyon", 1: "boston"}
# Device id: (its host, its site, its labels). Ids are what each device's own token names, not 0 … N−1.
DEVICES = {101: ("dnpz", 0, "kind=npz"), 102: ("dcsv", 0, "kind=csv"), 201: ("dimg", 1, "kind=images"),
           202: ("dflat", 1, "kind=npz"), 203: ("djoin", 1, "kind=npz,late=yes")}
MISFIT, JOINER = 202, 203
# The rest are started with the federation, the joiner once a run is under way.
AT_START = [d for d in DEVICES if d != JOINER]
# Each site's name and labels as its edge process reads them.
SITES = {e: {"FL_EDGE_NAME": site["name"], "FL_EDGE_LABELS": site["labels"]} for e, site in SITE_SETTINGS.items()}


def devices(fed: Federation, edge: int) -> list[DeviceInfo]:
    response = httpx.get(f"{fed.edges[edge].address()}/api/v1/devices",
                         headers={"Authorization": f"Bearer {fed.client_token}"}, timeout=10)
    response.raise_for_status()
    return [DeviceInfo.model_validate(d) for d in response.json()]


def wait_for(what, timeout_s: float = 120.0, poll_s: float = 0.3):
    deadline = time.monotonic() + timeout_s
    while not (found := what()):
        assert time.monotonic() < deadline, "timed out"
        time.sleep(poll_s)
    return found


@dataclass
class Federation:
    """The processes on the LAN, and what their REST APIs are reached with."""

    net: Lan
    topo: LocalTopology  # Redis and the cloud, on the operator's machine
    api: CloudAPI
    client_token: str  # the edges' client secret: it lists their devices (each device holds a token of its own)
    data: Path
    workdir: Path
    edges: list[Service] = field(default_factory=list)
    devices: dict[int, Service] = field(default_factory=dict)
    sources: dict[int, str] = field(default_factory=dict)  # each device's data spec

    def start_edge(self, edge_id: int) -> None:
        site = SITE_OF[edge_id]
        url = f"http://{self.net.address(site)}:{EDGE_PORT}"
        edge = Service(f"edge-{site}", ["-m", "fl_services.edge.main"], {
            "FL_EDGE_EDGE_ID": str(edge_id), **SITES[edge_id], "FL_EDGE_HOST": self.net.address(site),
            "FL_EDGE_PORT": str(EDGE_PORT), "FL_EDGE_PUBLIC_URL": url,
            "FL_EDGE_CLOUD_URL": f"http://{self.net.here}:{self.topo.cloud_url.rsplit(':', 1)[1]}",
            "FL_EDGE_EDGE_TOKEN": self.topo.edge_token, "FL_EDGE_CLIENT_TOKEN": self.client_token,
            "FL_EDGE_SITE_REPORT_S": "0.5", "FL_EDGE_TORCH_THREADS": "1", "FL_EDGE_LOG_LEVEL": "warning",
            "FL_EDGE_STATE_DIR": str(self.workdir / f"edge-{site}-state"),
        }, self.workdir / f"edge-{site}.log", url=url, prefix=self.net.prefix(site))
        self.edges.append(edge)
        edge.start()
        edge.wait_healthy()

    def start_device(self, device_id: int, source: str) -> None:
        host, edge_id, labels = DEVICES[device_id]
        [token] = issue_device_tokens(self.client_token, [device_id], site=SITE_OF[edge_id]).values()
        device = Service(f"device-{device_id}", ["-m", "fl_services.client.main"], {
            "FL_CLIENT_EDGE_URL": self.edges[edge_id].address(), "FL_CLIENT_CLIENTS": str(device_id),
            "FL_CLIENT_CLIENT_TOKEN": token, "FL_CLIENT_DATA": source, "FL_CLIENT_LABELS": labels,
            "FL_CLIENT_STATE_DIR": str(self.workdir / f"device-{device_id}-state"), "FL_CLIENT_TORCH_THREADS": "1",
            "FL_CLIENT_LOG_LEVEL": "warning",
        }, self.workdir / f"device-{device_id}.log", prefix=self.net.prefix(host))
        self.devices[device_id] = device
        self.sources[device_id] = source
        device.start()

    def registered(self, edge_id: int) -> set[int]:
        return {d.client_id for d in devices(self, edge_id)}

    def stop(self) -> None:
        for service in [*self.devices.values(), *self.edges]:
            service.stop()


def own_data(data: Path) -> dict[int, str]:
    """Each device's files (the joiner's come with it), of its own sizes and seeds: 1x8x8 samples of 10 classes,
    but the misfit's are flat."""
    (data / "images").mkdir()
    return {101: npz_file(data / "lyon-npz.npz", 40, 11), 102: csv_file(data / "lyon.csv", 30, 12),
            201: image_folder(data / "images", 30, 21), 202: npz_file(data / "flat.npz", 30, 22, flat=True)}


@pytest.fixture(scope="module")
def federation(tmp_path_factory) -> Iterator[Federation]:
    with lan(["lyon", "boston", *(host for host, _, _ in DEVICES.values())]) as net:
        workdir, data = tmp_path_factory.mktemp("namespaces"), tmp_path_factory.mktemp("device-data")
        sources = own_data(data)
        # The cloud listens beyond loopback, where the development tokens are refused: secrets of this run.
        topo = LocalTopology(num_clients=0, num_edges=0, workdir=workdir / "cloud",
                             redis_url=os.environ.get("REDIS_URL"), extra_env={"FL_CLOUD_HOST": "0.0.0.0"},
                             admin_token=secrets.token_hex(16), edge_token=secrets.token_hex(16),
                             client_token=secrets.token_hex(16))
        with topo, CloudAPI(topo.cloud_url, topo.admin_token) as api:
            fed = Federation(net, topo, api, topo.client_token, data, workdir)
            try:
                for edge_id in SITE_OF:
                    fed.start_edge(edge_id)
                for device_id in AT_START:
                    fed.start_device(device_id, sources[device_id])
                wait_for(lambda: fed.registered(0) == {101, 102} and fed.registered(1) == {201, 202}, 120)
                yield fed
            finally:
                fed.stop()


def test_sites_and_devices_register_across_the_lan(federation):
    fed, net = federation, federation.net
    found = wait_for(lambda: (s := fed.api.sites()) and len(s) == 2 and all(x.devices == 2 for x in s) and s, 60)
    assert [(s.name, s.edge_id, s.labels, s.url) for s in found] == [
        ("boston", 1, {"region": "us"}, f"http://{net.address('boston')}:{EDGE_PORT}"),
        ("lyon", 0, {"region": "eu", "tier": "gold"}, f"http://{net.address('lyon')}:{EDGE_PORT}")]
    for device_id in AT_START:  # each device runs on its own host and only dials out
        host = DEVICES[device_id][0]
        assert fed.devices[device_id].proc.pid in net.pids(host)
        assert net.listening(host) == ""
    for edge_id, edge in enumerate(fed.edges):
        assert edge.proc.pid in net.pids(SITE_OF[edge_id])
    boston = {d.client_id: d for d in devices(fed, 1)}
    assert boston[201].labels == {"kind": "images"} and boston[201].summary.input_shape == (1, 8, 8)
    assert boston[202].summary.input_shape == (64,)
    lyon = {d.client_id: d for d in devices(fed, 0)}
    assert lyon[101].summary.samples == 32 and lyon[102].summary.samples == 24  # less the fifth each holds out
    # A device's own token acts for that device only, at its site only: it cannot list the site's devices, and
    # taken to the other site it is refused, saying why.
    [token] = issue_device_tokens(fed.client_token, [101], site="lyon").values()
    bearer = {"Authorization": f"Bearer {token}"}
    assert httpx.get(f"{fed.edges[0].address()}/api/v1/devices", headers=bearer, timeout=10).status_code in (401, 403)
    elsewhere = httpx.post(f"{fed.edges[1].address()}/api/v1/clients", json={"client_id": 101}, headers=bearer,
                           timeout=10)
    assert elsewhere.status_code == 403 and "may join site 'lyon' only" in elsewhere.text


def test_a_run_over_both_sites_refuses_the_misfit_and_takes_the_joiner_from_its_next_round(federation):
    fed, api = federation, federation.api
    # min_devices counts the devices able to train the run: the misfit is connected but not counted.
    config = RunConfig(name="both-sites", rounds=10, selection={"sites": "all", "min_devices": 3}, **TASK)
    info = api.create_run(config)
    assert info.config.selection is not None and info.config.selection.edge_ids == [0, 1]
    api.action(info.run_id, "start")
    wait_for(lambda: api.run(info.run_id).version >= 2, 300, poll_s=0.05)
    api.action(info.run_id, "pause")
    paused_at = api.run(info.run_id).version
    fed.start_device(JOINER, npz_file(fed.data / "late.npz", 25, 23))
    wait_for(lambda: JOINER in fed.registered(1), 120)
    api.action(info.run_id, "resume")
    final = api.wait(info.run_id, timeout_s=300)
    assert final.status == RunStatus.finished and final.version == config.rounds
    history = api.history(info.run_id)
    for h in history:
        assert sorted(h.edges) == [0, 1]
        clients = {c.client_id: (c.edge_id, c.num_samples) for c in h.clients}
        # Each device at the site it registered at, with its own training split's size.
        assert {101: (0, 32), 102: (0, 24), 201: (1, 24)}.items() <= clients.items() and MISFIT not in clients
        [refused] = [f for f in h.failed_clients if f.client_id == MISFIT]
        assert refused.edge_id == 1 and "its samples have shape 64 but the run's model takes 1x8x8" in refused.error
    # The misfit's reason, as the run's own page over REST gives it.
    assert final.last_round is not None
    assert [f.error for f in final.last_round.failed_clients if f.client_id == MISFIT] == [refused.error]
    # The joiner is in no round begun before it registered, and in every round from the first it could join.
    joined = [JOINER in {c.client_id for c in h.clients} for h in history]
    first = joined.index(True)
    assert paused_at <= first <= paused_at + 1 and all(joined[first:]), joined
    assert {c.num_samples for h in history[first:] for c in h.clients if c.client_id == JOINER} == {20}


def test_a_run_selects_one_site_by_label(federation):
    api = federation.api
    config = RunConfig(name="eu-only", rounds=3, selection={"sites": {"region": "eu"}, "min_devices": 2}, **TASK)
    info = api.create_run(config)
    assert info.config.selection is not None and info.config.selection.edge_ids == [0]
    api.action(info.run_id, "start")
    final = api.wait(info.run_id, timeout_s=300)
    assert final.status == RunStatus.finished and final.version == config.rounds
    for h in api.history(info.run_id):
        assert h.edges == [0] and sorted(c.client_id for c in h.clients) == [101, 102] and not h.failed_clients


def weighted(figures: list[HeldOut], field: str) -> float:
    return sum(getattr(f, field) * f.num_samples for f in figures) / sum(f.num_samples for f in figures)


def test_a_run_evaluated_by_the_devices_on_their_own_held_out_splits(federation):
    fed, api = federation, federation.api
    config = RunConfig(name="federated-eval", rounds=3, evaluation="federated",
                       selection={"sites": "all", "min_devices": 3}, **TASK)
    info = api.create_run(config)
    api.action(info.run_id, "start")
    final = api.wait(info.run_id, timeout_s=300)
    assert final.status == RunStatus.finished and final.version == config.rounds
    history = api.history(info.run_id)
    # What each device registered: how many samples its own data holds out.
    held_out = {d.client_id: d.summary.held_out_samples for edge_id in SITE_OF for d in devices(fed, edge_id)
                if d.summary is not None}
    for h in history:
        assert math.isnan(h.test_accuracy)  # no test set at the cloud: the figures are the devices'
        [evaluation] = h.federated
        assert evaluation.version == h.round and [s.edge_id for s in evaluation.sites] == [0, 1]
        own = {c.client_id: c.evaluation for c in h.clients}
        assert set(own) == {101, 102, 201, JOINER} and MISFIT not in own  # the misfit trains and evaluates nothing
        assert all(e is not None and e.num_samples == held_out[k] for k, e in own.items())
        for site in evaluation.sites:
            mine = [c.evaluation for c in h.clients if c.edge_id == site.edge_id and c.evaluation is not None]
            assert site.num_samples == sum(e.num_samples for e in mine)
            assert site.accuracy == pytest.approx(weighted(mine, "accuracy"), rel=1e-9)
        assert evaluation.num_samples == sum(held_out[k] for k in own)
        assert evaluation.accuracy == pytest.approx(weighted(list(evaluation.sites), "accuracy"), rel=1e-9)
    # Version 0 is the run's initial model: each device's figures are that model on its held-out split, as
    # computed here from the device's own files.
    first = initial_model(config)
    for c in history[0].clients:
        assert c.evaluation is not None
        _, its_held_out = open_source(fed.sources[c.client_id]).load()
        expected = evaluate(first, its_held_out)
        assert (c.evaluation.loss, c.evaluation.accuracy) == pytest.approx((expected.loss, expected.accuracy), abs=1e-6)
