"""A long-poll its edge gave up on (the edge asks again whenever one of its rounds ends) stops waiting at the
next announce, in a real cloud process, instead of looking at Redis at every announce until its timeout."""
from __future__ import annotations

import threading
import time

import httpx
import pytest

from fl_services.fedctl.api import CloudAPI
from fl_services.fedctl.launch import LocalTopology
from fl_services.shared.core.config import RunConfig
from tests.prometheus import samples, value

pytestmark = pytest.mark.slow

GLOBAL = "/api/v1/edges/{edge_id}/global"


def polls_answered(url: str) -> float:
    scraped = samples(httpx.get(f"{url}/metrics", timeout=10).text)
    return value(scraped, "fl_http_request_duration_seconds_count", route=GLOBAL)


def test_an_abandoned_long_poll_ends_at_the_next_announce(tmp_path):
    with LocalTopology(num_clients=0, num_edges=1, workdir=tmp_path) as topo,\
            CloudAPI(topo.cloud_url, topo.admin_token) as api:
        topo.edges[0].stop()  # its own polls would come and go meanwhile: this test plays edge 0
        config = RunConfig(model={"name": "logreg"}, data={"dataset": "digits", "num_clients": 1}, rounds=5)
        run_id = api.create_run(config).run_id
        api.action(run_id, "start")
        before = polls_answered(topo.cloud_url)

        def abandoned() -> None:  # a poll with nothing to offer (busy with the one run), given up after 1 s
            with pytest.raises(httpx.ReadTimeout):
                httpx.get(f"{topo.cloud_url}/api/v1/edges/0/global", params={"busy": run_id, "timeout": 20},
                          headers={"Authorization": f"Bearer {topo.edge_token}"}, timeout=1.0)

        poller = threading.Thread(target=abandoned)
        poller.start()
        poller.join()
        api.action(run_id, "pause")  # an announce that offers that poll nothing
        deadline = time.monotonic() + 10
        while polls_answered(topo.cloud_url) < before + 1:
            assert time.monotonic() < deadline, "the abandoned poll still waits (its timeout was 20 s)"
            time.sleep(0.2)
        api.action(run_id, "stop")
