"""The Kubernetes manifests (docker/kubernetes) against the schemas and the code they run.

Each overlay is rendered with `kubectl kustomize` (no cluster needed) and every resource is validated
against Kubernetes' own schemas (kubernetes-validate, strict: an unknown field is an error). Then the
rendered topology is checked against the services: every FL_* variable is a field of the settings class
of the image it is set on and parses there, probes and ports match the settings, each site's edge id,
URLs and client ids fit the cloud's rule (logical client k goes to edge k mod L), and each client
StatefulSet splits its ids over exactly its replicas.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections import Counter
from pathlib import Path
from urllib.parse import urlsplit

import kubernetes_validate
import pytest
import yaml

from fl_services.client.config import ClientSettings
from tests.deployment import SETTINGS, unknown_settings

ROOT = Path(__file__).resolve().parent.parent
KUBE = ROOT / "docker" / "kubernetes"
OVERLAYS = sorted(p.parent for p in (KUBE / "overlays").glob("*/kustomization.yaml"))
# The oldest Kubernetes the manifests claim (the pod-index label the client hosts read is 1.28+).
KUBERNETES_VERSION = "1.28.0"
# The keys of the fl-secrets Secret docs/how-to-deploy-kubernetes.md tells the user to create.
SECRET_KEYS = {"admin-token", "edge-token", "client-token", "redis-password"}
IMAGES = {"fl-cloud": "cloud", "fl-edge": "edge", "fl-client": "client"}


def kubectl() -> str:
    path = shutil.which("kubectl")
    if path is None:
        pytest.skip("kubectl is not installed (./fl test installs it as root where apt offers it)")
    version = subprocess.run([path, "version", "--client"], capture_output=True, text=True, timeout=30).stdout
    match = re.search(r"Kustomize Version: v(\d+)", version)
    if not match or int(match.group(1)) < 5:  # `labels` and `patches` need kustomize 5 (kubectl 1.27+)
        pytest.skip(f"kubectl's kustomize is older than v5: {version.strip()!r}")
    return path


def render(overlay: Path) -> list[dict]:
    out = subprocess.run([kubectl(), "kustomize", str(overlay)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return [doc for doc in yaml.safe_load_all(out.stdout) if doc]


@pytest.fixture(scope="module", params=OVERLAYS, ids=[p.name for p in OVERLAYS])
def resources(request) -> list[dict]:
    return render(request.param)


def of_kind(resources: list[dict], kind: str) -> dict[str, dict]:
    return {r["metadata"]["name"]: r for r in resources if r["kind"] == kind}


def workloads(resources: list[dict]) -> dict[str, dict]:
    return {**of_kind(resources, "Deployment"), **of_kind(resources, "StatefulSet")}


def containers_running(resources: list[dict], pkg: str) -> list[tuple[dict, dict]]:
    """(workload, container) for every container whose image runs the package."""
    return [(w, c) for w in workloads(resources).values() for c in w["spec"]["template"]["spec"]["containers"]
            if IMAGES.get(c["image"].split(":")[0].rsplit("/", 1)[-1]) == pkg]


def plain_env(container: dict) -> dict[str, str]:
    """The container's variables as the service would see them: secrets as a stand-in value, a pod's
    index as 0, and $(VAR) references expanded as the kubelet does."""
    env: dict[str, str] = {}
    for var in container.get("env", []):
        if "value" in var:
            value = var["value"]
            for name, seen in env.items():
                value = value.replace(f"$({name})", seen)
            env[var["name"]] = value
        elif "secretKeyRef" in var["valueFrom"]:
            env[var["name"]] = f"secret-{var['valueFrom']['secretKeyRef']['key']}"
        else:
            env[var["name"]] = "0"
    return env


def service_for(resources: list[dict], url: str) -> tuple[dict, int]:
    """The Service a URL's host names, and the port it targets."""
    parts = urlsplit(url)
    services = of_kind(resources, "Service")
    assert parts.hostname in services, f"{url}: no Service {parts.hostname}"
    service = services[parts.hostname]
    port = next((p for p in service["spec"]["ports"] if p["port"] == parts.port), None)
    assert port is not None, f"{url}: Service {parts.hostname} has no port {parts.port}"
    return service, port


def selects(service: dict, workload: dict) -> bool:
    labels = workload["spec"]["template"]["metadata"]["labels"]
    return all(labels.get(k) == v for k, v in service["spec"]["selector"].items())


def test_there_is_an_overlay_and_every_file_is_in_a_kustomization():
    assert OVERLAYS
    listed = set()
    for kustomization in KUBE.rglob("kustomization.yaml"):
        listed.update((kustomization.parent / r).resolve() for r in yaml.safe_load(kustomization.read_text())
                      .get("resources", []))
    for manifest in KUBE.rglob("*.yaml"):
        if manifest.name != "kustomization.yaml":
            assert manifest.resolve() in listed, f"{manifest} is in no kustomization"


def test_every_resource_is_valid_against_the_kubernetes_schema(resources):
    for resource in resources:
        try:
            kubernetes_validate.validate(resource, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{resource['kind']}/{resource['metadata']['name']}: {exc.message} at {list(exc.path)}")


def test_no_placeholder_is_left(resources):
    assert "SET-BY-THE-SITE-OVERLAY" not in yaml.safe_dump_all(resources)


def test_every_image_is_one_of_the_built_services_or_redis(resources):
    for workload in workloads(resources).values():
        for container in workload["spec"]["template"]["spec"]["containers"]:
            name = container["image"].split(":")[0].rsplit("/", 1)[-1]
            assert name in IMAGES or name == "redis", container["image"]
            if name in IMAGES:
                assert (ROOT / "docker" / f"Dockerfile.{IMAGES[name]}").is_file()


@pytest.mark.parametrize("pkg", sorted(SETTINGS))
def test_environment_variables_are_settings_fields_and_parse(resources, pkg, monkeypatch):
    running = containers_running(resources, pkg)
    assert running, f"no container runs {pkg}"
    prefix, settings_cls = SETTINGS[pkg]
    for workload, container in running:
        env = plain_env(container)
        assert not unknown_settings(pkg, env), f"{workload['metadata']['name']}: {unknown_settings(pkg, env)}"
        for key in [k for k in os.environ if k.startswith("FL_")]:
            monkeypatch.delenv(key)
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        settings_cls()  # every value parses (a typo'd number or URL fails here, not in a pod)


def test_secrets_are_the_documented_keys_of_fl_secrets(resources):
    guide = (ROOT / "docs" / "how-to-deploy-kubernetes.md").read_text()
    used = set()
    for workload in workloads(resources).values():
        for container in workload["spec"]["template"]["spec"]["containers"]:
            for var in container.get("env", []):
                ref = var.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    assert ref["name"] == "fl-secrets", var
                    used.add(ref["key"])
    assert used == SECRET_KEYS
    for key in SECRET_KEYS:
        assert f"--from-literal={key}=" in guide, f"the guide's secret command lacks {key}"


@pytest.mark.parametrize("pkg", ["cloud", "edge"])
def test_servers_listen_where_their_service_and_probes_point(resources, pkg):
    prefix, _ = SETTINGS[pkg]
    services = of_kind(resources, "Service")
    for workload, container in containers_running(resources, pkg):
        env = plain_env(container)
        assert env[f"{prefix}HOST"] == "0.0.0.0"
        port = int(env[f"{prefix}PORT"])
        named = {p["name"]: p["containerPort"] for p in container["ports"]}
        assert named == {"http": port}
        assert container["readinessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
        assert container.get("livenessProbe"), workload["metadata"]["name"]
        fronting = [s for s in services.values() if s["spec"].get("selector") and selects(s, workload)]
        assert len(fronting) == 1 and fronting[0]["spec"]["ports"][0]["targetPort"] == "http"


def test_redis_keeps_an_append_only_file_on_a_volume_with_a_password(resources):
    (redis,) = of_kind(resources, "StatefulSet")["fl-redis"]["spec"]["template"]["spec"]["containers"]
    args = redis["args"]
    assert args[args.index("--appendonly") + 1] == "yes"
    assert args[args.index("--appendfsync") + 1] == "always"  # no accepted contribution lost in a crash
    assert args[args.index("--requirepass") + 1] == "$(REDIS_PASSWORD)"
    assert {"name": "data", "mountPath": "/data"} in redis["volumeMounts"]
    claims = of_kind(resources, "StatefulSet")["fl-redis"]["spec"]["volumeClaimTemplates"]
    assert [c["metadata"]["name"] for c in claims] == ["data"]


def test_the_cloud_reaches_redis_with_its_password(resources):
    ((_, cloud),) = containers_running(resources, "cloud")
    url = plain_env(cloud)["FL_CLOUD_REDIS_URL"]
    assert urlsplit(url).password == "secret-redis-password"
    service, port = service_for(resources, url.replace("redis://", "http://"))
    assert selects(service, of_kind(resources, "StatefulSet")["fl-redis"])


def test_each_site_has_one_edge_whose_clients_are_those_it_serves(resources):
    edges = containers_running(resources, "edge")
    clients = containers_running(resources, "client")
    num_edges = len(edges)
    assert num_edges >= 1 and len(clients) >= num_edges
    hosted: Counter[int] = Counter()
    for workload, container in edges:
        env = plain_env(container)
        assert workload["kind"] == "StatefulSet" and workload["spec"]["replicas"] == 1
        edge_id = int(env["FL_EDGE_EDGE_ID"])
        assert workload["spec"]["template"]["metadata"]["labels"]["fl.site"] == str(edge_id)
        cloud_service, _ = service_for(resources, env["FL_EDGE_CLOUD_URL"])
        assert selects(cloud_service, of_kind(resources, "Deployment")["fl-cloud"])
        public, _ = service_for(resources, env["FL_EDGE_PUBLIC_URL"])
        assert selects(public, workload)
        assert any(m["mountPath"] == env["FL_EDGE_STATE_DIR"] for m in container["volumeMounts"])
    for workload, container in clients:
        env = plain_env(container)
        edge_service, _ = service_for(resources, env["FL_CLIENT_EDGE_URL"])
        (edge_workload,) = [w for w, _ in edges if selects(edge_service, w)]
        edge_id = int(plain_env(edge_workload["spec"]["template"]["spec"]["containers"][0])["FL_EDGE_EDGE_ID"])
        replicas = workload["spec"]["replicas"]
        assert workload["kind"] == "StatefulSet"  # a stable index per pod, so each id keeps its state
        assert int(env["FL_CLIENT_SHARD_COUNT"]) == replicas
        index = next(v for v in container["env"] if v["name"] == "FL_CLIENT_SHARD_INDEX")
        assert index["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.labels['apps.kubernetes.io/pod-index']"
        assert any(m["mountPath"] == env["FL_CLIENT_STATE_DIR"] for m in container["volumeMounts"])
        for pod in range(replicas):
            ids = ClientSettings(clients=env["FL_CLIENT_CLIENTS"], shard_index=pod,
                                 shard_count=replicas).hosted_ids()
            assert all(k % num_edges == edge_id for k in ids), (workload["metadata"]["name"], ids)
            hosted.update(ids)
    assert sorted(hosted) == list(range(len(hosted))) and set(hosted.values()) == {1}, hosted


def test_two_sites_overlay_fits_the_documented_run_config():
    config = json.loads((ROOT / "docker" / "fedavg-two-edges.json").read_text())
    resources = render(KUBE / "overlays" / "two-sites")
    assert len(containers_running(resources, "edge")) == config["topology"]["num_edges"]
    ids = [k for w, c in containers_running(resources, "client") for k in
           ClientSettings(clients=plain_env(c)["FL_CLIENT_CLIENTS"]).hosted_ids()]
    assert sorted(ids) == list(range(config["data"]["num_clients"]))


def test_the_cloud_runs_as_replicas_that_roll(resources):
    cloud = of_kind(resources, "Deployment")["fl-cloud"]
    # Replicas coordinate through a lease per run (tests/integration/test_failover.py): more than one keeps
    # the cloud up when a pod dies, and a rolling update never leaves it without one.
    assert cloud["spec"]["replicas"] >= 2 and cloud["spec"]["strategy"]["type"] == "RollingUpdate"
