"""A cloud that fails over: two cloud replicas over one Redis behind nginx; the replica holding the update
lease is SIGKILLed in the middle of an update, and the run finishes on the other, equal to the reference,
every contribution counted once and every update computed once."""
from __future__ import annotations

import functools
import os
import signal
import time

import httpx
import pytest
import redis

from fl_services.cloud.storage.redis import Keys
from fl_services.fedctl.api import CloudAPI
from fl_services.fedctl.launch import LocalTopology
from fl_services.shared.core.config import RunConfig
from fl_services.shared.core.reference import ReferenceResult, run_reference
from fl_services.shared.core.reports import RunStatus
from tests.integration.balancer import NGINX, Nginx
from tests.prometheus import samples, value

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(NGINX is None, reason="nginx is not installed (apt-get install nginx; ./fl test "
                                                      "installs it as root)")]

CONFIG = RunConfig(name="failover", rounds=5, model={"name": "cnn"},
                   data={"dataset": "mnist5k", "num_clients": 4}, local={"epochs": 1, "batch_size": 32, "lr": 0.05})


@functools.cache
def reference() -> ReferenceResult:
    """The in-process reference for CONFIG, computed once for both parametrisations."""
    return run_reference(CONFIG)


def updates_computed(url: str) -> float:
    """What the replica's metrics say it computed: the count of its cloud_update histogram."""
    return value(samples(httpx.get(f"{url}/metrics", timeout=10).text), "fl_cloud_update_duration_seconds_count")


@pytest.mark.parametrize("blobs", ["in redis", "in files"])
def test_the_run_finishes_on_the_other_replica_when_the_lease_holder_is_killed(tmp_path, blobs):
    balancer = Nginx(tmp_path / "nginx")
    # In files: both replicas keep contributions' blobs in one directory (FL_CLOUD_BLOB_DIR), as on a shared volume.
    env = {"FL_CLOUD_LEASE_S": "3", **({"FL_CLOUD_BLOB_DIR": str(tmp_path / "blobs")} if blobs == "in files" else {})}
    try:
        with LocalTopology(num_clients=4, num_edges=1, procs_per_edge=2, workdir=tmp_path, cloud_replicas=2,
                           cloud_front=balancer.start, extra_env=env) as topo,\
                CloudAPI(topo.cloud_url, topo.admin_token) as api:
            assert topo.cloud_url == balancer.url and len(topo.clouds) == 2
            keys, r = Keys(topo.key_prefix), redis.Redis.from_url(topo.redis_url)
            run_id = api.create_run(CONFIG).run_id
            api.action(run_id, "start")
            # Watch the lease: once it is held at a version past 0, kill its holder. That is nearly always the
            # moment after its commit of version 1, before it announced it and released the lease: the survivor
            # learns of that version from its own loop's look, and computes every later one.
            deadline = time.monotonic() + 300
            holder, killed_at = None, -1
            while holder is None:
                assert time.monotonic() < deadline, "no update lease seen"
                before = int(r.hget(keys.meta(run_id), "version") or 0)
                token = r.get(keys.lease(run_id))
                version = int(r.hget(keys.meta(run_id), "version") or 0)
                if token is not None and version == before >= 1:
                    holder = next(c for c in topo.clouds if token.decode().startswith(c.name + ":"))
                    assert holder.proc is not None
                    os.kill(holder.proc.pid, signal.SIGKILL)
                    killed_at = version  # it was computing version + 1
                time.sleep(0.002)
            survivor = next(c for c in topo.clouds if c is not holder)
            final = api.wait(run_id, timeout_s=600)
            assert holder.proc.wait(10) == -signal.SIGKILL
            assert final.status == RunStatus.finished and final.version == CONFIG.rounds

            history = api.history(run_id)
            reference_run = reference()
            model = api.model(run_id)
            for name, expected in reference_run.global_state.items():
                assert (model[name] - expected).abs().max() <= 1e-5, name
            assert [h.test_accuracy for h in history] == pytest.approx(
                [h.test_accuracy for h in reference_run.history], abs=2e-3)

            # Every version once; the one under way at the kill and all later ones computed by the survivor.
            assert [h.version for h in history] == list(range(1, CONFIG.rounds + 1))
            computed_by = [h.computed_by for h in history]
            assert computed_by[killed_at:] == [survivor.name] * (CONFIG.rounds - killed_at), computed_by
            assert set(computed_by[:killed_at]) <= {holder.name, survivor.name}
            # Nothing lost or counted twice: each accepted contribution (one idempotency key each) entered
            # exactly one version, the one it was computed on, and none waits in the buffer.
            assert [(c.edge_id, c.base_version) for h in history for c in h.contributions] ==\
                [(0, v) for v in range(CONFIG.rounds)]
            assert r.hlen(keys.idempotency(run_id)) == CONFIG.rounds
            assert r.xlen(keys.buffer(run_id)) == 0 and r.hlen(keys.pending(run_id)) == 0
            # No update computed twice: the survivor computed each of its versions exactly once (the killed
            # replica published nothing of the one it was computing: that version is the survivor's).
            assert updates_computed(survivor.address()) == computed_by.count(survivor.name), survivor.log_tail()
            assert r.exists(keys.lease(run_id)) == 0
    finally:
        balancer.stop()
