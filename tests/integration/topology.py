"""Real processes for the integration tests: Redis, the cloud, edges and client processes."""
from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager

from fl_services.fedctl.api import CloudAPI
from fl_services.fedctl.launch import LocalTopology
from fl_services.shared.core.config import RunConfig
from fl_services.shared.core.reports import RoundRecord, RunStatus
from fl_services.shared.core.tensors import Tensors
from fl_services.shared.wire.admin import RunInfo


@contextmanager
def federation(tmp_path_factory, num_clients: int, num_edges: int = 1, procs_per_edge: int = 2,
               edge_env: dict[int, dict[str, str]] | None = None,
               extra_env: dict[str, str] | None = None,
               client_env: dict[int, dict[str, str]] | None = None) -> Iterator[tuple[LocalTopology, CloudAPI]]:
    """A running topology and an admin client of its cloud; $REDIS_URL, if set, replaces the private Redis."""
    workdir = tmp_path_factory.mktemp(f"topo{num_edges}")
    with LocalTopology(num_clients=num_clients, num_edges=num_edges, procs_per_edge=procs_per_edge,
                       workdir=workdir, redis_url=os.environ.get("REDIS_URL"), edge_env=edge_env or {},
                       extra_env=extra_env or {}, client_env=client_env or {}) as topo,\
            CloudAPI(topo.cloud_url, topo.admin_token) as api:
        # The topology is ready once the edges answer and hold their clients; each registers with the cloud (its
        # site, its site key) as its loop starts, which a loaded host may not have reached yet.
        deadline = time.monotonic() + 60
        while sorted(s.edge_id for s in api.sites()) != list(range(num_edges)) and time.monotonic() < deadline:
            time.sleep(0.2)
        yield topo, api


def run(api: CloudAPI, config: RunConfig) -> tuple[RunInfo, list[RoundRecord], Tensors]:
    """Creates and starts the run, waits for it to finish: its final info, history and model."""
    info = api.create_run(config)
    assert info.status == RunStatus.created and info.version == 0
    api.action(info.run_id, "start")
    final = api.wait(info.run_id, timeout_s=600)
    assert final.status == RunStatus.finished and final.version == config.rounds
    return final, api.history(info.run_id), api.model(info.run_id)
