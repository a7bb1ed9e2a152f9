"""Metrics and logs of a real federation: the cloud's and the edges' `/metrics`, scraped over HTTP and
parsed with prometheus_client, agree with the run's history; every service logs JSON lines with its
context; every metric the Grafana dashboard queries is exported."""
from __future__ import annotations

import json
from collections import Counter

import httpx
import pytest

from fl_services.fedctl.api import CloudAPI
from fl_services.fedctl.launch import LocalTopology
from fl_services.shared.core.config import RunConfig
from fl_services.shared.core.reports import RunStatus
from tests.prometheus import samples, value
from tests.test_monitoring import dashboard_metric_names

pytestmark = pytest.mark.slow

ROUNDS = 4
JSON_LOGS = {f"FL_{service}_LOG_FORMAT": "json" for service in ("CLOUD", "EDGE", "CLIENT")}
DEBUG = {f"FL_{service}_LOG_LEVEL": "debug" for service in ("CLOUD", "EDGE", "CLIENT")}


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("metrics")
    with LocalTopology(num_clients=8, num_edges=2, procs_per_edge=1, workdir=workdir,
                       extra_env={**JSON_LOGS, **DEBUG}) as topo, CloudAPI(topo.cloud_url, topo.admin_token) as api:
        config = RunConfig(name="metrics", rounds=ROUNDS, model={"name": "logreg"},
                           data={"dataset": "digits", "num_clients": 8}, topology={"num_edges": 2, "buffer_size": 2})
        run_id = api.create_run(config).run_id
        api.action(run_id, "start")
        assert api.wait(run_id, timeout_s=300, poll_s=0.1).status == RunStatus.finished
        scrapes = {"cloud": samples(httpx.get(f"{topo.cloud_url}/metrics").text)}
        for e, edge in enumerate(topo.edges):
            scrapes[f"edge{e}"] = samples(httpx.get(f"{edge.url}/metrics").text)
        yield run_id, api.history(run_id), scrapes, workdir, topo


def test_cloud_counters_match_the_history(finished_run) -> None:
    run_id, history, scrapes, *_ = finished_run
    cloud = scrapes["cloud"]
    per_edge = Counter(e for h in history for e in h.edges)
    assert sum(per_edge.values()) == sum(len(h.contributions) for h in history) == 2 * ROUNDS
    for edge_id, count in per_edge.items():
        assert value(cloud, "fl_cloud_contributions_total", edge_id=str(edge_id), outcome="accepted") == count
    assert value(cloud, "fl_cloud_contributions_total", outcome="duplicate") == 0
    assert value(cloud, "fl_cloud_contributions_refused_total") == 0
    assert value(cloud, "fl_cloud_global_version", run_id=run_id) == len(history) == ROUNDS
    assert value(cloud, "fl_cloud_buffer_depth", run_id=run_id) == 0
    assert value(cloud, "fl_cloud_update_duration_seconds_count") == ROUNDS
    assert value(cloud, "fl_http_request_duration_seconds_count", method="POST",
                 route="/api/v1/edges/{edge_id}/contributions", status="202") == 2 * ROUNDS


@pytest.mark.parametrize("edge_id", [0, 1])
def test_edge_counters_match_the_history(finished_run, edge_id: int) -> None:
    _, history, scrapes, *_ = finished_run
    edge = scrapes[f"edge{edge_id}"]
    clients = [c for h in history for c in h.clients if c.edge_id == edge_id]
    rounds = sum(edge_id in h.edges for h in history)
    assert value(edge, "fl_edge_results_received_total") == len(clients) > 0
    assert value(edge, "fl_edge_results_refused_total") == 0
    assert value(edge, "fl_client_samples_total") == sum(c.num_samples for c in clients)
    assert value(edge, "fl_client_train_seconds_count") == len(clients)
    assert value(edge, "fl_client_train_seconds_sum") > 0
    assert value(edge, "fl_edge_round_duration_seconds_count") == rounds
    assert value(edge, "fl_edge_submissions_total", status="202") == rounds
    assert value(edge, "fl_edge_clients_connected") == 4
    assert value(edge, "fl_edge_tasks_outstanding") == 0
    assert value(edge, "fl_edge_global_version") == ROUNDS - 1  # the last state it trained on
    # Each result went up alone (202) or in a result bundle with others of its process (200): never more
    # requests than results, and none refused.
    singles = value(edge, "fl_http_request_duration_seconds_count", method="POST",
                    route="/api/v1/clients/{client_id}/results", status="202")
    bundles = value(edge, "fl_http_request_duration_seconds_count", method="POST",
                    route="/api/v1/clients/results", status="200")
    assert 0 < singles + bundles <= len(clients)


def test_every_metric_of_the_dashboard_is_exported(finished_run) -> None:
    scraped = {name for scrape in finished_run[2].values() for name, _ in scrape}
    assert dashboard_metric_names() - scraped == set()


def test_every_service_logs_json_lines_with_its_context(finished_run) -> None:
    run_id, _, _, workdir, _ = finished_run
    logs = {path.stem: [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
            for path in workdir.glob("*.log")}
    assert set(logs) == {"cloud", "edge0", "edge1", "client0.0", "client1.0"}
    for name, lines in logs.items():
        assert all({"time", "level", "logger", "message"} <= set(line) for line in lines), name
    for e in (0, 1):
        assert all(line["edge_id"] == e for line in logs[f"edge{e}"])
        rounds = [line for line in logs[f"edge{e}"] if line["logger"] == "fl_services.edge.round_loop"
                  and "done with" in line["message"]]
        assert len(rounds) == ROUNDS and all(line["run_id"] == run_id for line in rounds)
        tasks = [line for line in logs[f"client{e}.0"] if line["logger"] == "fl_services.client.worker"]
        assert Counter(line["client_id"] for line in tasks) == {k: ROUNDS for k in range(e, 8, 2)}
    versions = [line for line in logs["cloud"] if line["logger"] == "fl_services.cloud.orchestrator"]
    assert len(versions) == ROUNDS and all(line["run_id"] == run_id for line in versions)


def test_the_gauges_read_redis_after_a_cloud_restart(finished_run) -> None:
    run_id, *_, topo = finished_run
    topo.restart_cloud()  # SIGKILL: the new process has seen nothing of the run
    cloud = samples(httpx.get(f"{topo.cloud_url}/metrics").text)
    assert value(cloud, "fl_cloud_global_version", run_id=run_id) == ROUNDS
    assert value(cloud, "fl_cloud_buffer_depth", run_id=run_id) == 0
    assert value(cloud, "fl_cloud_contributions_total") == 0  # counters are the process's own
