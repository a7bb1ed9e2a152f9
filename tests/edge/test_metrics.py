"""The edge's `/metrics`: results accepted and refused by reason, the clients' reported training time
and samples, clients connected and tasks outstanding."""
from __future__ import annotations

import pytest

from edge.metrics import REFUSALS
from tests.edge.harness import Edge, result, running_edge
from tests.prometheus import samples, value

pytestmark = pytest.mark.anyio

RESULTS = "/api/v1/clients/{client_id}/results"


async def scrape(edge: Edge) -> dict:
    r = await edge.http.get("/metrics")
    assert r.status_code == 200, r.text
    return samples(r.text)


async def test_results_tasks_and_clients(edge: Edge) -> None:
    await edge.open_tasks(0, 1, 2)
    await edge.register(3)  # registered, no task
    m = await scrape(edge)
    assert value(m, "fl_edge_clients_connected") == 4
    assert value(m, "fl_edge_tasks_outstanding") == 3
    assert (await edge.send_result(0, result(0, num_samples=7, train_seconds=1.5))).status_code == 202
    assert (await edge.send_result(1, result(1, num_samples=5))).status_code == 202  # an older client: no time
    assert (await edge.send_result(0, result(0))).status_code == 409  # duplicate
    assert (await edge.send_result(2, result(2, task_id="gone"))).status_code == 409  # stale
    assert (await edge.send_result(9, result(9))).status_code == 404  # never registered
    assert (await edge.send_result(2, b"junk")).status_code == 400
    m = await scrape(edge)
    assert value(m, "fl_edge_results_received_total") == 2
    refused = {reason: value(m, "fl_edge_results_refused_total", reason=reason) for reason in REFUSALS}
    assert refused == {**dict.fromkeys(REFUSALS, 0.0), "duplicate": 1, "stale": 1, "not_found": 1, "unreadable": 1}
    assert value(m, "fl_client_samples_total") == 12
    assert value(m, "fl_client_train_seconds_count") == 1
    assert value(m, "fl_client_train_seconds_sum") == 1.5
    assert value(m, "fl_edge_tasks_outstanding") == 1
    assert value(m, "fl_http_request_duration_seconds_count", method="POST", route=RESULTS) == 6


async def test_result_too_large_is_counted() -> None:
    async with running_edge(max_payload_bytes=1000) as edge:
        await edge.open_tasks(0)
        assert (await edge.send_result(0, b"x" * 5000)).status_code == 413
        m = await scrape(edge)
    assert value(m, "fl_edge_results_refused_total", reason="too_large") == 1
    assert value(m, "fl_http_request_duration_seconds_count", route=RESULTS, status="413") == 1
