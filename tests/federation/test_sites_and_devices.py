"""A federation of real devices through the services: two sites (edges with names and labels) and devices holding
their OWN data files written here (npz, CSV, an image folder), none of them a partition. A run over both sites waits
until enough devices are registered, refuses the device whose data has the wrong shape (with its reason, every
round), and takes a device that registers mid-run from its next round on; a second run selects one site by label;
the cloud's site registry and each edge's device registry show them all. (The same on hosts of their own, each
device with its own token: tests/integration/test_federation_namespaces.py.)"""
from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from fl_services.shared.core.config import RunConfig
from fl_services.shared.core.reference import Device
from fl_services.shared.core.reports import RunStatus
from fl_services.shared.wire.admin import DeviceInfo, SiteInfo
from tests.federation.harness import CLIENT_TOKEN, SITE_REPORT_S, EdgeNode, Federation, federation
from tests.web import bearer

pytestmark = pytest.mark.anyio

# The run's task: the digits data set's, 1x8x8 samples of 10 classes (the cloud evaluates on its test split).
TASK: dict[str, Any] = {"model": {"name": "logreg"}, "data": {"dataset": "digits", "num_clients": 2},
                        "policy": {"deadline_s": 60, "min_fraction": 0.5, "max_retries": 0}}
SITES = {0: {"name": "lyon", "labels": "region=eu,tier=gold"}, 1: {"name": "boston", "labels": "region=us"}}
JOINER = 1007  # an id no launcher's 0 … N−1 gives: the one its own token would name


def samples(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 10, size=n)
    x = (rng.random((n, 1, 8, 8)) * 0.3 + y[:, None, None, None] / 10).astype(np.float32)
    return x, y.astype(np.int64)


def npz_file(path: Path, n: int, seed: int, flat: bool = False) -> str:
    x, y = samples(n, seed)
    np.savez(path, x=x.reshape(n, -1) if flat else x, y=y)
    return f"npz:{path}"


def csv_file(path: Path, n: int, seed: int) -> str:
    x, y = samples(n, seed)
    rows = [",".join([f"f{i}" for i in range(64)] + ["label"])]
    rows += [",".join([*(f"{v:.4f}" for v in row.reshape(-1)), str(label)]) for row, label in zip(x, y, strict=True)]
    path.write_text("\n".join(rows) + "\n")
    return f"csv:{path}?label=label&shape=1x8x8"


def image_folder(path: Path, n: int, seed: int) -> str:
    x, y = samples(n, seed)
    for i, (image, label) in enumerate(zip(x, y, strict=True)):
        (path / str(label)).mkdir(parents=True, exist_ok=True)
        Image.fromarray((image[0] * 255).clip(0, 255).astype(np.uint8), mode="L").save(path / str(label) / f"{i}.png")
    return f"image-folder:{path}?shape=1x8x8"


@pytest.fixture
async def sites(cloud_storage, tmp_path) -> AsyncIterator[Federation]:
    (tmp_path / "images").mkdir()
    # Client k dials edge k mod 2, one id a worker: ids 0, 2 at lyon, 1, 3 at boston. 0: an npz; 2: a CSV; 1: an
    # image folder; 3: an npz of flat rows, which no 1x8x8 model takes.
    own = {0: npz_file(tmp_path / "lyon0.npz", 40, 0), 2: csv_file(tmp_path / "lyon2.csv", 30, 2),
           1: image_folder(tmp_path / "images", 30, 1), 3: npz_file(tmp_path / "flat.npz", 30, 3, flat=True)}
    labels = {0: "kind=npz", 2: "kind=csv", 1: "kind=images", 3: "kind=npz"}
    async with federation(cloud_storage, tmp_path, num_clients=4, num_edges=2, procs_per_edge=2,
                          edge=lambda e: {**SITES[e], "site_report_s": SITE_REPORT_S},
                          client=lambda ids: {"data": own[ids[0]], "labels": labels[ids[0]]}) as fed:
        yield fed


async def devices(edge: EdgeNode) -> list[DeviceInfo]:
    response = await edge.http.get("/api/v1/devices", headers=bearer(CLIENT_TOKEN))
    assert response.status_code == 200, response.text
    return [DeviceInfo.model_validate(d) for d in response.json()]


async def wait_for(what: Callable[[], Awaitable[Any]], timeout_s: float = 120.0, poll_s: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout_s
    while not (found := await what()):
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(poll_s)
    return found


async def test_sites_and_devices_are_registered_with_what_they_declare(sites):
    async def both_report_their_devices() -> list[SiteInfo] | None:  # each site's count arrives with its next report
        listed = [SiteInfo.model_validate(s) for s in (await sites.cloud_request("GET", "/api/v1/sites")).json()]
        return listed if len(listed) == 2 and all(s.devices == 2 for s in listed) else None

    found = await wait_for(both_report_their_devices)
    assert [(s.name, s.edge_id, s.labels) for s in found] == [("boston", 1, {"region": "us"}),
                                                              ("lyon", 0, {"region": "eu", "tier": "gold"})]
    assert all(s.url is None for s in found)  # no public_url set: the edges' own address is not theirs to guess
    boston = {d.client_id: d for d in await devices(sites.edges[1])}
    assert sorted(boston) == [1, 3] and boston[1].labels == {"kind": "images"}
    assert boston[1].summary is not None and boston[1].summary.input_shape == (1, 8, 8)
    assert boston[3].summary is not None and boston[3].summary.input_shape == (64,)
    lyon = {d.client_id: d for d in await devices(sites.edges[0])}
    assert lyon[2].summary is not None and lyon[2].summary.samples == 24  # 30 less its fifth held out
    assert (await sites.edges[0].http.get("/api/v1/devices")).status_code == 401


async def test_a_run_over_both_sites_refuses_a_misfit_and_takes_a_joiner_from_its_next_round(sites, tmp_path):
    admin = sites.admin
    # min_devices counts the devices able to train the run: the misfit is connected but not counted.
    config = RunConfig(name="both-sites", rounds=20, selection={"sites": "all", "min_devices": 3}, **TASK)
    info = await admin.create_run(config)
    assert info.config.selection is not None and info.config.selection.edge_ids == [0, 1]
    assert info.config.topology.num_edges == 2 and info.config.topology.buffer_size == 2
    await admin.action(info.run_id, "start")
    await admin.wait_version(info.run_id, 1, timeout_s=300)
    await admin.action(info.run_id, "pause")
    paused_at = (await admin.run(info.run_id)).version
    await sites.join(Device(JOINER, 1, npz_file(tmp_path / "joiner.npz", 25, 7), {"kind": "npz", "late": "yes"}))
    assert JOINER in {d.client_id for d in await devices(sites.edges[1])}
    await admin.action(info.run_id, "resume")
    final = await admin.wait(info.run_id, timeout_s=300)
    assert final.status == RunStatus.finished and final.version == 20
    history = await admin.history(info.run_id)
    for h in history:
        assert sorted(h.edges) == [0, 1]
        clients = {c.client_id: c for c in h.clients}
        assert {0, 1, 2} <= set(clients) and 3 not in clients
        assert clients[0].num_samples == 32 and clients[2].num_samples == 24  # each device's own training split
        refused = [f for f in h.failed_clients if f.client_id == 3]
        assert refused and "its samples have shape 64 but the run's model takes 1x8x8" in refused[0].error
    # Rounds begun before the joiner registered do not have it; the last round (begun after) does.
    assert all(JOINER not in {c.client_id for c in h.clients} for h in history[:paused_at])
    assert JOINER in {c.client_id for c in history[-1].clients}


async def test_a_run_selects_one_site_by_label(sites):
    config = RunConfig(name="eu-only", rounds=2, selection={"sites": {"region": "eu"}, "min_devices": 2}, **TASK)
    info = await sites.admin.create_run(config)
    assert info.config.selection is not None and info.config.selection.edge_ids == [0]
    await sites.admin.action(info.run_id, "start")
    final = await sites.admin.wait(info.run_id, timeout_s=300)
    assert final.status == RunStatus.finished
    for h in await sites.admin.history(info.run_id):
        assert h.edges == [0] and sorted(c.client_id for c in h.clients) == [0, 2]


async def test_a_run_waits_for_its_devices_then_fails_saying_why(sites):
    config = RunConfig(name="too-many", rounds=2, selection={"min_devices": 50, "start_timeout_s": 2}, **TASK)
    info = await sites.admin.create_run(config)
    assert (await sites.admin.action(info.run_id, "start")).status == RunStatus.waiting
    final = await sites.admin.wait(info.run_id, timeout_s=60)
    assert final.status == RunStatus.stopped and final.version == 0
    assert final.reason is not None and "for 50 devices" in final.reason


async def test_a_selection_that_names_no_registered_site_is_refused(sites):
    body = RunConfig(name="nowhere", selection={"sites": ["paris"]}, **TASK).model_dump(mode="json")
    response = await sites.cloud_request("POST", "/api/v1/runs", json=body)
    assert response.status_code == 422, response.text
    assert "sites that are not registered: ['paris']" in response.text
