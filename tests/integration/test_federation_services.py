"""A federation of real devices through real processes: two sites (edges with names and labels) and devices
holding their OWN data files written here (npz, CSV, an image folder), none of them a partition. A run over both
sites waits until enough devices are registered, refuses the device whose data has the wrong shape (with its
reason, every round), and takes a device that registers mid-run from its next round on; a second run selects
one site by label; the cloud's site registry and each edge's device registry show them all."""
from __future__ import annotations

import time

import httpx
import numpy as np
import pytest
from PIL import Image

from fl_services.fedctl.launch import Service
from fl_services.shared.core.config import RunConfig
from fl_services.shared.core.reports import RunStatus
from fl_services.shared.wire.admin import DeviceInfo
from tests.integration.topology import federation

pytestmark = pytest.mark.slow

# The run's task: the digits data set's, 1x8x8 samples of 10 classes (the cloud evaluates on its test split).
TASK = {"model": {"name": "logreg"}, "data": {"dataset": "digits", "num_clients": 2},
        "policy": {"deadline_s": 60, "min_fraction": 0.5, "max_retries": 0}}
SITES = {0: {"FL_EDGE_NAME": "lyon", "FL_EDGE_LABELS": "region=eu,tier=gold"},
         1: {"FL_EDGE_NAME": "boston", "FL_EDGE_LABELS": "region=us"}}
JOINER = 1007  # an id no launcher's 0 … N−1 gives: the one its own token would name


def samples(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 10, size=n)
    x = (rng.random((n, 1, 8, 8)) * 0.3 + y[:, None, None, None] / 10).astype(np.float32)
    return x, y.astype(np.int64)


def npz_file(path, n: int, seed: int, flat: bool = False) -> str:
    x, y = samples(n, seed)
    np.savez(path, x=x.reshape(n, -1) if flat else x, y=y)
    return f"npz:{path}"


def csv_file(path, n: int, seed: int) -> str:
    x, y = samples(n, seed)
    rows = [",".join([f"f{i}" for i in range(64)] + ["label"])]
    rows += [",".join([*(f"{v:.4f}" for v in row.reshape(-1)), str(label)]) for row, label in zip(x, y, strict=True)]
    path.write_text("\n".join(rows) + "\n")
    return f"csv:{path}?label=label&shape=1x8x8"


def image_folder(path, n: int, seed: int) -> str:
    x, y = samples(n, seed)
    for i, (image, label) in enumerate(zip(x, y, strict=True)):
        (path / str(label)).mkdir(parents=True, exist_ok=True)
        Image.fromarray((image[0] * 255).clip(0, 255).astype(np.uint8), mode="L").save(path / str(label) / f"{i}.png")
    return f"image-folder:{path}?shape=1x8x8"


@pytest.fixture(scope="module")
def sites(tmp_path_factory):
    data = tmp_path_factory.mktemp("device-data")
    (data / "images").mkdir()
    # Launch order (LocalTopology starts client k at edge k mod 2, one id a process): ids 0, 2 at lyon, 1, 3 at
    # boston. 0: an npz; 2: a CSV; 1: an image folder; 3: an npz of flat rows, which no 1x8x8 model takes.
    own = {0: npz_file(data / "lyon0.npz", 40, 0), 1: csv_file(data / "lyon2.csv", 30, 2),
           2: image_folder(data / "images", 30, 1), 3: npz_file(data / "flat.npz", 30, 3, flat=True)}
    labels = {0: "kind=npz", 1: "kind=csv", 2: "kind=images", 3: "kind=npz"}
    client_env = {p: {"FL_CLIENT_DATA": own[p], "FL_CLIENT_LABELS": labels[p]} for p in own}
    edge_env = {e: {**env, "FL_EDGE_SITE_REPORT_S": "0.5"} for e, env in SITES.items()}
    with federation(tmp_path_factory, num_clients=4, num_edges=2, procs_per_edge=2, edge_env=edge_env,
                    client_env=client_env) as (topo, api):
        yield topo, api, data


def devices(topo, edge: int) -> list[DeviceInfo]:
    response = httpx.get(f"{topo.edges[edge].address()}/api/v1/devices",
                         headers={"Authorization": f"Bearer {topo.client_token}"}, timeout=10)
    response.raise_for_status()
    return [DeviceInfo.model_validate(d) for d in response.json()]


def wait_for(what, timeout_s: float = 120.0, poll_s: float = 0.3):
    deadline = time.monotonic() + timeout_s
    while not (found := what()):
        assert time.monotonic() < deadline, "timed out"
        time.sleep(poll_s)
    return found


def start_joiner(topo, data) -> Service:
    joiner = Service("joiner", ["-m", "fl_services.client.main"], {
        "FL_CLIENT_EDGE_URL": topo.edges[1].address(), "FL_CLIENT_CLIENTS": str(JOINER),
        "FL_CLIENT_CLIENT_TOKEN": topo.client_token, "FL_CLIENT_STATE_DIR": str(data / "joiner-state"),
        "FL_CLIENT_DATA": npz_file(data / "joiner.npz", 25, 7), "FL_CLIENT_LABELS": "kind=npz,late=yes",
        "FL_CLIENT_TORCH_THREADS": "1", "FL_CLIENT_LOG_LEVEL": "warning"}, data / "joiner.log")
    joiner.start()
    return joiner


def test_sites_and_devices_are_registered_with_what_they_declare(sites):
    topo, api, _ = sites
    def both_report_their_devices():  # each site's count arrives with its own next report
        listed = api.sites()
        return listed if len(listed) == 2 and all(s.devices == 2 for s in listed) else None

    found = wait_for(both_report_their_devices)
    assert [(s.name, s.edge_id, s.labels) for s in found] == [("boston", 1, {"region": "us"}),
                                                              ("lyon", 0, {"region": "eu", "tier": "gold"})]
    assert all(s.url == topo.edges[s.edge_id].address() or s.url is None for s in found)
    boston = {d.client_id: d for d in devices(topo, 1)}
    assert sorted(boston) == [1, 3] and boston[1].labels == {"kind": "images"}
    assert boston[1].summary is not None and boston[1].summary.input_shape == (1, 8, 8)
    assert boston[3].summary is not None and boston[3].summary.input_shape == (64,)
    lyon = {d.client_id: d for d in devices(topo, 0)}
    assert lyon[2].summary is not None and lyon[2].summary.samples == 24  # 30 less its fifth held out
    assert httpx.get(f"{topo.edges[0].address()}/api/v1/devices", timeout=10).status_code == 401


def test_a_run_over_both_sites_refuses_a_misfit_and_takes_a_joiner_from_its_next_round(sites):
    topo, api, data = sites
    # min_devices counts the devices able to train the run: the misfit is connected but not counted.
    config = RunConfig(name="both-sites", rounds=20, selection={"sites": "all", "min_devices": 3}, **TASK)
    info = api.create_run(config)
    assert info.config.selection is not None and info.config.selection.edge_ids == [0, 1]
    assert info.config.topology.num_edges == 2 and info.config.topology.buffer_size == 2
    api.action(info.run_id, "start")
    wait_for(lambda: api.run(info.run_id).version >= 1, 300, poll_s=0.05)
    api.action(info.run_id, "pause")
    paused_at = api.run(info.run_id).version
    joiner = start_joiner(topo, data)
    try:
        wait_for(lambda: any(d.client_id == JOINER for d in devices(topo, 1)))
        api.action(info.run_id, "resume")
        final = api.wait(info.run_id, timeout_s=300)
    finally:
        joiner.stop()
    assert final.status == RunStatus.finished and final.version == 20
    history = api.history(info.run_id)
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


def test_a_run_selects_one_site_by_label(sites):
    _, api, _ = sites
    config = RunConfig(name="eu-only", rounds=2, selection={"sites": {"region": "eu"}, "min_devices": 2}, **TASK)
    info = api.create_run(config)
    assert info.config.selection is not None and info.config.selection.edge_ids == [0]
    api.action(info.run_id, "start")
    final = api.wait(info.run_id, timeout_s=300)
    assert final.status == RunStatus.finished
    for h in api.history(info.run_id):
        assert h.edges == [0] and sorted(c.client_id for c in h.clients) == [0, 2]


def test_a_run_waits_for_its_devices_then_fails_saying_why(sites):
    _, api, _ = sites
    config = RunConfig(name="too-many", rounds=2, selection={"min_devices": 50, "start_timeout_s": 2}, **TASK)
    info = api.create_run(config)
    assert api.action(info.run_id, "start").status == RunStatus.waiting
    final = api.wait(info.run_id, timeout_s=60)
    assert final.status == RunStatus.stopped and final.version == 0
    assert final.reason is not None and "for 50 devices" in final.reason


def test_a_selection_that_names_no_registered_site_is_refused(sites):
    _, api, _ = sites
    with pytest.raises(RuntimeError, match=r"422 .*sites that are not registered: \['paris'\]"):
        api.create_run(RunConfig(name="nowhere", selection={"sites": ["paris"]}, **TASK))
