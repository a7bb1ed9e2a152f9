"""Several runs at once on one cloud: each is offered to the edges its topology includes, a poll that knows
a run which ends answers at once, and one run's failure stops that run only."""
from __future__ import annotations

import asyncio
import time

import pytest

from fl_services.cloud.storage.redis import Keys
from fl_services.shared.core.algorithms.fedavg import FedAvg
from fl_services.shared.core.tensors import decode
from fl_services.shared.wire.edge_cloud import GlobalStateHeader
from fl_services.shared.wire.protocol import LIVE_RUNS
from tests.cloud.harness import Cloud, contribution, small_config, two_edge_config
from tests.web import detail_of

pytestmark = pytest.mark.anyio


async def poll(cloud: Cloud, edge_id: int, timeout: float = 0, **params) -> tuple[int, GlobalStateHeader | None, str]:
    r = await cloud.edge("GET", f"/api/v1/edges/{edge_id}/global", params={"timeout": timeout, **params})
    assert r.status_code in (200, 204), r.text
    header = decode(r.content, GlobalStateHeader)[1] if r.status_code == 200 else None
    return r.status_code, header, r.headers[LIVE_RUNS]


async def started(cloud: Cloud, config: dict) -> str:
    run_id = await cloud.create_run(config)
    await cloud.action(run_id, "start")
    return run_id


async def test_every_run_reaches_the_edges_its_topology_includes(cloud: Cloud) -> None:
    for edge_id in (0, 1):
        await cloud.register_edge(edge_id)
    one_edge = await started(cloud, small_config(name="one-edge"))
    two_edges = await started(cloud, two_edge_config())
    assert await cloud.redis.smembers(Keys(cloud.prefix).active) == {one_edge.encode(), two_edges.encode()}
    both = ",".join(sorted([one_edge, two_edges]))

    # Edge 0 takes part in both: each poll offers a run it has not seen, then nothing.
    _, first, live = await poll(cloud, 0)
    assert first is not None and first.version == 0 and live == both
    _, second, _ = await poll(cloud, 0, seen=[f"{first.run_id}:0"])
    assert second is not None and {first.run_id, second.run_id} == {one_edge, two_edges}
    assert (await poll(cloud, 0, seen=[f"{first.run_id}:0"], busy=[second.run_id]))[:2] == (204, None)
    # others=false: only the runs listed; edge 1 is in the two-edge run only.
    assert (await poll(cloud, 0, seen=[f"{first.run_id}:0"], others="false"))[:2] == (204, None)
    status, offered, live = await poll(cloud, 1)
    assert (status, offered.run_id if offered else None, live) == (200, two_edges, two_edges)

    # A contribution to one run moves that run only.
    global_, _ = await cloud.global_state(0)
    _, one_edge_state, _ = await poll(cloud, 0, seen=[f"{two_edges}:0"])
    assert one_edge_state is not None and one_edge_state.run_id == one_edge
    r = await cloud.submit(0, contribution(global_, one_edge))
    assert r.status_code == 202, r.text
    await cloud.wait_version(one_edge, 1)
    status, offered, _ = await poll(cloud, 0, seen=[f"{one_edge}:0", f"{two_edges}:0"])
    assert status == 200 and (offered.run_id, offered.version) == (one_edge, 1)
    assert (await cloud.info(two_edges))["version"] == 0


async def test_a_long_poll_ends_at_once_when_a_run_the_edge_knows_ends(cloud: Cloud) -> None:
    """The edge works on run A (busy) and has seen B: stopping A answers its poll at once, A no longer live."""
    await cloud.register_edge(0)
    run_a, run_b = await started(cloud, small_config()), await started(cloud, small_config())

    async def stop_soon() -> None:
        await asyncio.sleep(0.3)
        await cloud.action(run_a, "stop")

    stopping = asyncio.create_task(stop_soon())
    began = time.monotonic()
    status, offered, live = await poll(cloud, 0, timeout=1.5, busy=[run_a], seen=[f"{run_b}:0"])
    await stopping
    assert (status, offered, live) == (204, None, run_b)
    assert time.monotonic() - began < 1.2, "the poll waited out its timeout"
    # And a run the edge lists that is not live (stopped, finished, unknown) answers at once too.
    began = time.monotonic()
    assert (await poll(cloud, 0, timeout=1.5, seen=[f"{run_a}:0", f"{run_b}:0"]))[:2] == (204, None)
    assert time.monotonic() - began < 1.0


@pytest.mark.parametrize("entry", ["no-colon", "run:x", ":3", "run:-2"])
async def test_a_malformed_seen_entry_is_refused(cloud: Cloud, entry: str) -> None:
    await cloud.register_edge(0)
    r = await cloud.edge("GET", "/api/v1/edges/0/global", params={"timeout": 0, "seen": [entry]})
    assert "is not 'run_id:version'" in detail_of(r, 422)


async def test_one_runs_divergence_stops_that_run_only(cloud: Cloud, monkeypatch: pytest.MonkeyPatch) -> None:
    cloud_update = FedAvg.cloud_update

    def diverges_if_named_bad(self, *args, **kwargs):
        new_global, new_state = cloud_update(self, *args, **kwargs)
        if self.config.name == "bad":
            new_global = {g: {n: t.fill_(float("nan")) for n, t in ts.items()} for g, ts in new_global.items()}
        return new_global, new_state

    monkeypatch.setattr(FedAvg, "cloud_update", diverges_if_named_bad)
    await cloud.register_edge(0)
    bad, good = await started(cloud, small_config(name="bad", rounds=3)), await started(cloud, small_config(rounds=3))
    global_, _ = await cloud.global_state(0)
    for run_id in (bad, good):
        assert (await cloud.submit(0, contribution(global_, run_id))).status_code == 202
    await cloud.wait_version(good, 1)
    for _ in range(100):
        if (await cloud.info(bad))["status"] == "stopped":
            break
        await asyncio.sleep(0.05)
    bad_info, good_info = await cloud.info(bad), await cloud.info(good)
    assert (bad_info["status"], bad_info["version"]) == ("stopped", 0)
    assert (good_info["status"], good_info["version"]) == ("running", 1)
    assert await cloud.redis.smembers(Keys(cloud.prefix).active) == {good.encode()}


async def test_a_run_left_active_by_an_older_cloud_stays_active(cloud: Cloud) -> None:
    """Before several runs, the one active run's id was a string key: the cloud moves it into the set."""
    await cloud.register_edge(0)
    run_id = await started(cloud, small_config())
    keys = Keys(cloud.prefix)
    await cloud.redis.delete(keys.active)
    await cloud.redis.set(keys.legacy_active, run_id)
    await cloud.app.state.store.migrate()
    assert await cloud.redis.smembers(keys.active) == {run_id.encode()}
    assert await cloud.redis.exists(keys.legacy_active) == 0
    assert (await poll(cloud, 0))[1] is not None
