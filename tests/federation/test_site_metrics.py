"""Devices registered and connected per site, scraped from the running services' `/metrics`: each edge's own
gauges, and the cloud's from the sites' reports."""
import asyncio
import time

import pytest

from fl_services.edge.config import EdgeSettings
from fl_services.edge.services.devices import connected_devices, offline_after_s
from fl_services.edge.tasks import TaskBoard
from fl_services.shared.wire.client_edge import ClientRegistration
from tests.federation.harness import SITE_REPORT_S, federation
from tests.prometheus import samples, value

pytestmark = pytest.mark.anyio


async def test_devices_registered_and_connected_per_site_are_scraped_from_the_edges_and_the_cloud(cloud_storage,
                                                                                                   tmp_path):
    names = {0: "clinic-a", 1: "clinic-b"}
    async with federation(cloud_storage, tmp_path, num_clients=5, num_edges=2, procs_per_edge=1,
                          edge=lambda e: {"name": names[e], "site_report_s": SITE_REPORT_S}) as fed:
        expected = {"clinic-a": 3, "clinic-b": 2}  # clients 0, 2, 4 dial edge 0; 1, 3 edge 1
        for node in fed.edges:
            scraped = samples((await node.http.get("/metrics")).text)
            site = names[node.edge_id]
            assert value(scraped, "fl_edge_devices_registered", site=site) == expected[site]
            assert value(scraped, "fl_edge_devices_connected", site=site) == expected[site]
        deadline = time.monotonic() + 30
        while True:  # the cloud's figures arrive with each site's next report
            scraped = samples((await fed.cloud_request("GET", "/metrics", token=None)).text)
            seen = {site: (value(scraped, "fl_cloud_site_devices_registered", site=site),
                           value(scraped, "fl_cloud_site_devices_connected", site=site)) for site in expected}
            if seen == {site: (n, n) for site, n in expected.items()}:
                break
            assert time.monotonic() < deadline, seen
            await asyncio.sleep(0.05)
        sites = (await fed.cloud_request("GET", "/api/v1/sites")).json()
        assert {s["name"]: (s["devices"], s["states"].get("offline", 0)) for s in sites} ==\
            {"clinic-a": (3, 0), "clinic-b": (2, 0)}


def test_a_device_unheard_for_longer_than_the_offline_window_is_registered_but_not_connected():
    board = TaskBoard(offline_after_s=60)
    for k in (3, 5, 8):
        board.register(ClientRegistration(client_id=k))
    board.last_seen[5] = time.time() - 61
    assert connected_devices(board=board) == 2
    board.offline_after_s = 120
    assert connected_devices(board=board) == 3
    assert offline_after_s(EdgeSettings(long_poll_max_s=20)) == 45
