"""docker-compose's `monitoring` profile, checked without a Docker engine: Prometheus scrapes every
cloud and edge service at its port, Grafana is provisioned with that Prometheus and the dashboard kept
in the repository, and every metric the dashboard queries is one the services export."""
from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from fl_services.cloud.app import create_app as create_cloud
from fl_services.cloud.config import CloudSettings
from fl_services.edge.app import create_app as create_edge
from fl_services.edge.config import EdgeSettings
from tests.prometheus import exposable_names
from tests.test_compose import SERVICES, environment

ROOT = Path(__file__).resolve().parent.parent
DASHBOARD = ROOT / "docker/grafana/dashboards/fl.json"
MONITORING = ("prometheus", "grafana")
METRIC = re.compile(r"\bfl_[a-z0-9_]+")


def dashboard_exprs() -> list[str]:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return [target["expr"] for panel in panels for target in panel["targets"]]


def dashboard_metric_names() -> set[str]:
    return {name for expr in dashboard_exprs() for name in METRIC.findall(expr)}


def mounts(service: str) -> dict[str, Path]:
    """Container path -> repository path of a service's bind mounts."""
    out = {}
    for volume in SERVICES[service].get("volumes", []):
        source, target, *_ = volume.split(":")
        if source.startswith("./"):
            out[target] = ROOT / source
    return out


def test_every_dashboard_metric_is_exported() -> None:
    exported = exposable_names(create_cloud(CloudSettings()).state.metrics.registry)\
        | exposable_names(create_edge(EdgeSettings()).state.metrics.registry)
    assert all(METRIC.search(expr) for expr in dashboard_exprs())  # every query reads one of ours
    assert len(dashboard_metric_names()) >= 10
    assert dashboard_metric_names() - exported == set()


def test_monitoring_services_start_only_with_their_profile() -> None:
    for name in MONITORING:
        assert SERVICES[name]["profiles"] == ["monitoring"]
        assert "healthcheck" in SERVICES[name]
    assert not [name for name, service in SERVICES.items() if name not in MONITORING and "profiles" in service]


def test_prometheus_scrapes_the_cloud_and_every_edge() -> None:
    (config_path,) = [p for target, p in mounts("prometheus").items() if target.endswith("prometheus.yml")]
    config = yaml.safe_load(config_path.read_text())
    targets = {t for job in config["scrape_configs"] for static in job["static_configs"] for t in static["targets"]}
    ports = {name: environment(service).get("FL_CLOUD_PORT") or environment(service).get("FL_EDGE_PORT")
             for name, service in SERVICES.items() if name == "cloud" or re.fullmatch(r"edge\d+", name)}
    expected = {f"{name}:{port}" for name, port in ports.items()}
    assert targets == expected
    assert all(job.get("metrics_path", "/metrics") == "/metrics" for job in config["scrape_configs"])


def test_grafana_is_provisioned_with_prometheus_and_the_dashboard() -> None:
    volumes = mounts("grafana")
    provisioning = volumes["/etc/grafana/provisioning"]
    (source,) = yaml.safe_load((provisioning / "datasources/prometheus.yml").read_text())["datasources"]
    assert source["type"] == "prometheus" and source["url"] == "http://prometheus:9090"
    (provider,) = yaml.safe_load((provisioning / "dashboards/fl.yml").read_text())["providers"]
    assert volumes[provider["options"]["path"]] == DASHBOARD.parent
    dashboard = json.loads(DASHBOARD.read_text())
    uids = {target["datasource"]["uid"] for panel in dashboard["panels"] for target in panel["targets"]}
    assert uids == {source["uid"]}
    home = environment(SERVICES["grafana"])["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert volumes[str(Path(home).parent)] / Path(home).name == DASHBOARD
