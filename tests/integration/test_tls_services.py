"""Every hop over TLS, as an operator deploys it: the certificates of `fedctl certs`, Redis over TLS with a
password, the cloud and two edges serving HTTPS with mutual TLS, client processes presenting their own
certificates and a device token per logical client (not the edges' client secret), as the compose TLS
variant's containers do; the model equals the in-process reference. Devices with a certificate the edge must refuse
(none, expired, another CA's) or that trust another CA are refused at the handshake, and the run does not
notice them."""
from __future__ import annotations

import secrets
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
import redis
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from fl_services.fedctl.api import CloudAPI
from fl_services.fedctl.certs import Issued, issue, write_deployment
from fl_services.fedctl.launch import LocalTopology, Service
from fl_services.shared.core.config import RunConfig
from fl_services.shared.core.reference import run_reference
from fl_services.shared.core.reports import RunStatus
from fl_services.shared.wire.admin import EdgeHealth
from fl_services.shared.wire.tls import client_context
from tests.fedctl.test_errors import _fedctl
from tests.federation.checks import assert_same_model

pytestmark = pytest.mark.slow

CONFIG = RunConfig(name="tls", model={"name": "logreg"}, rounds=4, data={"dataset": "digits", "num_clients": 4},
                   local={"lr": 0.1}, topology={"num_edges": 2, "buffer_size": 2})


@pytest.fixture(scope="module")
def topo(tmp_path_factory):
    # Its own Redis (not $REDIS_URL): the one it starts speaks TLS with a password.
    with LocalTopology(num_clients=4, num_edges=2, procs_per_edge=1, mutual_tls=True, device_tokens=True,
                       client_token=secrets.token_hex(16), workdir=tmp_path_factory.mktemp("tls")) as topo:
        yield topo


def load_ca(certs: Path) -> Issued:
    key = serialization.load_pem_private_key((certs / "ca.key").read_bytes(), None)
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    return Issued(key, x509.load_pem_x509_certificate((certs / "ca.pem").read_bytes()))


def bad_device(topo: LocalTopology, name: str, tls_env: dict[str, str]) -> Service:
    """A client process with the right token but the given TLS settings, for logical client 4: edge 0's (4 mod
    2), outside the run, so that the edge's count of registered clients shows whether it got in."""
    edge = topo.edges[0]
    return Service(name, ["-m", "fl_services.client.main"], {
        "FL_CLIENT_EDGE_URL": edge.address(), "FL_CLIENT_CLIENTS": "4", "FL_CLIENT_CLIENT_TOKEN": topo.client_token,
        "FL_CLIENT_STATE_DIR": str(topo.workdir / f"{name}-state"), "FL_CLIENT_LOG_LEVEL": "warning", **tls_env,
    }, topo.workdir / f"{name}.log")


def wait_for_log(service: Service, text: str, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while text not in service.log.read_text(errors="replace"):
        assert time.monotonic() < deadline, f"{service.name} never logged {text!r}:\n{service.log_tail()}"
        time.sleep(0.5)


def test_a_run_over_mutual_tls_equals_the_reference_and_refused_devices_do_not_touch_it(topo, tmp_path):
    certs = topo.certs
    ca = str(certs / "ca.pem")
    expired = issue(load_ca(certs), "client9", server=False, client=True, days=1,
                    not_before=datetime.now(UTC) - timedelta(days=3)).write(tmp_path, "expired")
    write_deployment(tmp_path / "other", edges=0, clients=1)
    other_cert, other_key = tmp_path / "other" / "client0.pem", tmp_path / "other" / "client0.key"
    own_cert, own_key = certs / "client0.pem", certs / "client0.key"
    devices = {
        # the edge refuses these at the handshake: no certificate, an expired one, one another CA signed
        "no-certificate": ({"FL_CLIENT_EDGE_CA_FILE": ca}, "Server disconnected"),
        "expired": ({"FL_CLIENT_EDGE_CA_FILE": ca, "FL_CLIENT_EDGE_CERT_FILE": str(expired[0]),
                     "FL_CLIENT_EDGE_KEY_FILE": str(expired[1])}, "Server disconnected"),
        "foreign-certificate": ({"FL_CLIENT_EDGE_CA_FILE": ca, "FL_CLIENT_EDGE_CERT_FILE": str(other_cert),
                                 "FL_CLIENT_EDGE_KEY_FILE": str(other_key)}, "Server disconnected"),
        # this one refuses the edge: it trusts another CA (a man in the middle looks the same to it)
        "wrong-ca": ({"FL_CLIENT_EDGE_CA_FILE": str(tmp_path / "other" / "ca.pem"),
                      "FL_CLIENT_EDGE_CERT_FILE": str(own_cert), "FL_CLIENT_EDGE_KEY_FILE": str(own_key)},
                     "CERTIFICATE_VERIFY_FAILED"),
    }
    bad = {name: bad_device(topo, name, env) for name, (env, _) in devices.items()}
    for service in bad.values():
        service.start()
    try:
        for name, (_, refusal) in devices.items():
            wait_for_log(bad[name], refusal)  # each has tried, and been refused, before the run starts
        with CloudAPI(topo.cloud_url, topo.admin_token, tls=topo.client_tls()) as api:
            info = api.create_run(CONFIG)
            api.action(info.run_id, "start")
            final = api.wait(info.run_id, timeout_s=300)
            history, model = api.history(info.run_id), api.model(info.run_id)
        assert all(service.alive() for service in bad.values())  # still trying, still refused
        registered = [EdgeHealth.model_validate_json(edge.health().content).clients for edge in topo.edges]
    finally:
        for service in bad.values():
            service.stop()

    assert final.status == RunStatus.finished and final.version == CONFIG.rounds
    # Every client process held its clients' own tokens, never the edges' client secret.
    assert sorted(topo.tokens) == [0, 1, 2, 3]
    assert all("FL_CLIENT_CLIENT_TOKEN" not in c.env and topo.client_token not in str(c.env) for c in topo.clients)
    assert all(sorted(c.client_id for c in h.clients) == [0, 1, 2, 3] for h in history)
    assert registered == [2, 2]  # the good processes' clients only
    assert_same_model(model, run_reference(CONFIG).global_state)


def test_plain_http_and_callers_without_a_certificate_get_nothing(topo):
    for service in [topo.cloud, *topo.edges]:
        assert service is not None and service.url is not None
        assert service.health().status_code == 200  # with the CA and admin.pem: served
        with pytest.raises(httpx.TransportError):  # plain HTTP to the TLS port
            httpx.get(service.url.replace("https://", "http://") + "/health", timeout=5.0)
        with pytest.raises(httpx.TransportError):  # TLS, the right CA, no certificate
            httpx.get(f"{service.url}/health", timeout=5.0, verify=client_context(topo.certs / "ca.pem"))
        with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):  # the public CAs only
            httpx.get(f"{service.url}/health", timeout=5.0)


def test_redis_speaks_tls_only_and_requires_the_password(topo):
    assert topo.redis is not None and topo.redis_url is not None
    assert topo.redis_url.startswith("rediss://:")
    # retry=None: redis-py's default would retry each of these refusals with backoff (~5 s).
    with pytest.raises(redis.ConnectionError):  # plain text
        redis.Redis(port=topo.redis.port, password=topo.redis.password, socket_timeout=5, retry=None).ping()
    with pytest.raises(redis.AuthenticationError):  # TLS, certificate, no password
        redis.Redis(port=topo.redis.port, socket_timeout=5, ssl=True, retry=None,
                    **topo.redis.client_options()).ping()


def test_fedctl_drives_the_cloud_over_mutual_tls(topo, tmp_path):
    certs, cloud = topo.certs, ["--cloud", topo.cloud_url, "--token", topo.admin_token]
    config = tmp_path / "run.json"
    config.write_text(CONFIG.model_dump_json())
    done = _fedctl("--ca-file", str(certs / "ca.pem"), "--cert-file", str(certs / "admin.pem"),
                   "--key-file", str(certs / "admin.key"), "create", str(config), *cloud, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    run_id = done.stdout.strip()
    listed = _fedctl("runs", *cloud, env={"FL_CA_FILE": str(certs / "ca.pem"), "FL_CERT_FILE": str(certs / "admin.pem"),
                                          "FL_KEY_FILE": str(certs / "admin.key")}, timeout=300)
    assert listed.returncode == 0 and run_id in listed.stdout, listed.stdout + listed.stderr
    refused = _fedctl("--ca-file", str(certs / "ca.pem"), "runs", *cloud, timeout=300)  # no certificate to present
    assert refused.returncode == 1 and "Traceback" not in refused.stdout + refused.stderr
    assert "error:" in refused.stdout + refused.stderr
