"""The edge's `/metrics`: results accepted and refused by reason, the clients' reported training time
and samples, clients connected and tasks outstanding."""
from __future__ import annotations

import asyncio

import pytest

from fl_services.edge.metrics import REFUSALS
from fl_services.shared.server.metrics import RequestMetrics, ServiceMetrics
from tests.edge.harness import CONFIG, CloudDouble, Edge, answer_tasks, result, running_edge, until
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


async def test_metrics_switched_off() -> None:
    """FL_EDGE_METRICS=false: no request middleware, no /metrics, and a whole round still runs (the round loop
    and the results route count through the null object)."""
    cloud = CloudDouble()
    async with running_edge(cloud_transport=cloud.transport(), metrics=False) as edge:
        assert (await edge.http.get("/metrics")).status_code == 404
        assert RequestMetrics not in [m.cls for m in edge.app.user_middleware]
        assert not isinstance(edge.app.state.round_loop.metrics, ServiceMetrics)
        clients = asyncio.create_task(answer_tasks(edge, range(CONFIG.data.num_clients)))
        try:
            await until(lambda: cloud.contributions, what="the round is submitted")
        finally:
            clients.cancel()
    assert sorted(p.client_id for p in cloud.contributions[0].clients) == list(range(CONFIG.data.num_clients))
