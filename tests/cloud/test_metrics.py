"""The cloud's `/metrics`, scraped as Prometheus does: requests by route template and status,
contributions accepted and refused by reason, the run's version and buffer read from Redis."""
from __future__ import annotations

import pytest

from fl_services.cloud.metrics import REFUSALS
from fl_services.fedctl.redis_server import free_port
from fl_services.shared.server.metrics import RequestMetrics, ServiceMetrics
from fl_services.shared.wire.protocol import SAFETENSORS
from tests.cloud.harness import (
    Cloud,
    contribution,
    running_cloud,
    running_run,
    two_edge_config,
)
from tests.prometheus import samples, value
from tests.web import bearer

pytestmark = pytest.mark.anyio

SUBMIT = "/api/v1/edges/{edge_id}/contributions"


async def scrape(cloud: Cloud, **headers: str) -> dict:
    r = await cloud.http.get("/metrics", headers=headers)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain")
    return samples(r.text)


async def test_contributions_by_outcome_and_refusal_reason(cloud: Cloud) -> None:
    run_id, global_ = await running_run(cloud, two_edge_config())  # edge 1 never sends: one stays buffered
    blob = contribution(global_, run_id)
    assert (await cloud.submit(0, blob)).status_code == 202
    assert (await cloud.submit(0, blob)).status_code == 202  # a retry: duplicate
    assert (await cloud.submit(0, contribution(global_, run_id, key="other"))).status_code == 409  # same slot
    assert (await cloud.submit(0, contribution(global_, run_id, base_version=5, key="k5"))).status_code == 409
    assert (await cloud.submit(0, blob, token="wrong")).status_code == 401
    assert (await cloud.submit(0, b"not safetensors")).status_code == 400
    assert (await cloud.submit(1, blob)).status_code == 422  # header says edge 0
    m = await scrape(cloud)
    assert value(m, "fl_cloud_contributions_total", edge_id="0", outcome="accepted") == 1
    assert value(m, "fl_cloud_contributions_total", outcome="duplicate") == 1
    refused = {reason: value(m, "fl_cloud_contributions_refused_total", reason=reason) for reason in REFUSALS}
    assert refused == {**dict.fromkeys(REFUSALS, 0.0), "conflict": 1, "future": 1, "unauthorized": 1,
                       "unreadable": 1, "invalid": 1}
    # Requests are labelled by route template and status, never by raw path.
    assert value(m, "fl_http_request_duration_seconds_count", method="POST", route=SUBMIT, status="202") == 2
    assert value(m, "fl_http_request_duration_seconds_count", route=SUBMIT, status="409") == 2
    assert not [labels for (_, labels) in m if ("route", "/api/v1/edges/0/contributions") in labels]
    # Gauges come from Redis: the run's version and what waits in its buffer.
    assert value(m, "fl_cloud_global_version", run_id=run_id) == 0
    assert value(m, "fl_cloud_buffer_depth", run_id=run_id) == 1


async def test_a_stale_contribution_and_the_update_duration(cloud: Cloud) -> None:
    run_id, global_ = await running_run(cloud)
    assert (await cloud.submit(0, contribution(global_, run_id))).status_code == 202
    await cloud.wait_version(run_id, 1)
    assert (await cloud.submit(0, contribution(global_, run_id, key="again"))).status_code == 409
    m = await scrape(cloud)
    assert value(m, "fl_cloud_contributions_refused_total", reason="stale") == 1
    assert value(m, "fl_cloud_update_duration_seconds_count") == 1
    assert value(m, "fl_cloud_update_duration_seconds_sum") > 0
    assert (value(m, "fl_cloud_global_version", run_id=run_id), value(m, "fl_cloud_buffer_depth", run_id=run_id))\
        == (1, 0)


async def test_a_body_refused_before_routing_is_labelled_with_its_route(redis_url: str) -> None:
    async with running_cloud(redis_url, max_payload_bytes=1000) as cloud:
        r = await cloud.submit(0, b"x" * 5000, headers={"Content-Type": SAFETENSORS})
        assert r.status_code == 413
        m = await scrape(cloud)
    assert value(m, "fl_cloud_contributions_refused_total", reason="too_large") == 1
    assert value(m, "fl_http_request_duration_seconds_count", route=SUBMIT, status="413") == 1


async def test_long_polls_fit_in_the_latency_buckets(cloud: Cloud) -> None:
    await cloud.register_edge(0)
    r = await cloud.edge("GET", "/api/v1/edges/0/global", params={"timeout": 0.3})
    assert r.status_code == 204
    await cloud.http.get("/no/such/path")
    m = await scrape(cloud)
    route = "/api/v1/edges/{edge_id}/global"
    assert value(m, "fl_http_request_duration_seconds_count", route=route, status="204") == 1
    buckets = sorted(float(dict(ls)["le"]) for (n, ls) in m
                     if n == "fl_http_request_duration_seconds_bucket" and ("route", route) in ls)
    assert 2.0 in buckets and buckets[-2] > 2.0  # the harness's long-poll cap, and one bucket past it
    assert value(m, "fl_http_request_duration_seconds_count", route="unmatched", status="404") == 1


async def test_two_apps_in_one_process_count_apart(redis_url: str) -> None:
    async with running_cloud(redis_url) as first, running_cloud(redis_url) as second:
        await first.http.get("/health")
        await first.http.get("/health")
        await second.http.get("/health")
        assert value(await scrape(first), "fl_http_request_duration_seconds_count", route="/health") == 2
        assert value(await scrape(second), "fl_http_request_duration_seconds_count", route="/health") == 1


@pytest.mark.parametrize("token", [None, "wrong"])
async def test_metrics_token_when_set(redis_url: str, token: str | None) -> None:
    async with running_cloud(redis_url, metrics_token="scrape-secret") as cloud:
        assert (await cloud.http.get("/metrics", headers=bearer(token))).status_code == 401
        assert value(await scrape(cloud, **bearer("scrape-secret")), "fl_cloud_contributions_refused_total") == 0


async def test_an_empty_metrics_token_setting_means_open(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # An env file's `FL_CLOUD_METRICS_TOKEN=` line: as a token it would refuse every scrape (no request can
    # carry an empty bearer token), so it means unset.
    monkeypatch.setenv("FL_CLOUD_METRICS_TOKEN", "")
    async with running_cloud(redis_url) as cloud:
        assert (await cloud.http.get("/metrics")).status_code == 200


async def test_a_scrape_without_redis_still_reports_the_counters() -> None:
    async with running_cloud(f"redis://127.0.0.1:{free_port()}/0") as cloud:
        await cloud.http.get("/no/such/path")
        m = await scrape(cloud)
    assert value(m, "fl_http_request_duration_seconds_count", route="unmatched") == 1
    assert not [name for name, _ in m if name == "fl_cloud_global_version"]


async def test_made_up_methods_and_paths_add_no_series(cloud: Cloud) -> None:
    # Any token is a valid HTTP method and any path can be asked for: neither may become a label value,
    # or a scanner hitting the cloud would grow the scrape (and Prometheus's memory) without bound.
    for i in range(50):
        assert (await cloud.http.request(f"M{i}", "/health")).status_code == 405
        assert (await cloud.http.get(f"/no/such/path/{i}")).status_code == 404
    m = await scrape(cloud)
    methods = {dict(labels)["method"] for (name, labels) in m if name == "fl_http_request_duration_seconds_count"}
    assert methods <= {"GET", "POST", "other"}, methods
    assert value(m, "fl_http_request_duration_seconds_count", method="other", route="/health", status="405") == 50
    assert value(m, "fl_http_request_duration_seconds_count", route="unmatched", status="404") == 50


async def test_an_edge_id_spelled_with_leading_zeros_counts_for_that_edge(cloud: Cloud) -> None:
    # The route reads "007" as edge 7 and accepts it: the counter must not open a series per spelling.
    run_id, global_ = await running_run(cloud, two_edge_config())
    r = await cloud.edge("POST", "/api/v1/edges/000/contributions", content=contribution(global_, run_id),
                         headers={"Content-Type": SAFETENSORS})
    assert r.status_code == 202, r.text
    m = await scrape(cloud)
    assert value(m, "fl_cloud_contributions_total", edge_id="0", outcome="accepted") == 1
    assert {dict(labels)["edge_id"] for (name, labels) in m if name == "fl_cloud_contributions_total"} == {"0"}


async def test_metrics_switched_off(redis_url: str) -> None:
    """FL_CLOUD_METRICS=false: no request middleware, no /metrics, and a run's updates still compute (the
    orchestrator counts through the null object)."""
    async with running_cloud(redis_url, metrics=False) as cloud:
        assert (await cloud.http.get("/metrics")).status_code == 404
        assert RequestMetrics not in [m.cls for m in cloud.app.user_middleware]
        assert not isinstance(cloud.app.state.orchestrator.metrics, ServiceMetrics)
        run_id, global_ = await running_run(cloud)
        assert (await cloud.submit(0, contribution(global_, run_id))).status_code == 202
        assert (await cloud.wait_version(run_id, 1))["version"] == 1
