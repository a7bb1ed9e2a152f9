"""`fedctl certs` as an operator runs it: the files it writes, checked with an X.509 path validator."""
from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.x509.verification import PolicyBuilder, Store, VerificationError

from tests.fedctl.test_errors import _fedctl


def load(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def test_certs_makes_a_ca_and_certificates_that_verify_for_their_hosts_and_roles(tmp_path):
    out = tmp_path / "certs"
    done = _fedctl("certs", str(out), "--host", "fl.example.org", "--host", "10.1.2.3", "--edges", "2",
                   "--clients", "3", "--days", "30")
    assert done.returncode == 0, done.stderr
    names = {"ca", "cloud", "edge0", "edge1", "redis", "admin", "client0", "client1", "client2"}
    assert {p.name for p in out.iterdir()} == {f"{n}.{ext}" for n in names for ext in ("pem", "key")}
    assert all((out / f"{n}.key").stat().st_mode & 0o077 == 0 for n in names)  # keys: owner only
    store = Store([load(out / "ca.pem")])
    policy = PolicyBuilder().store(store)
    for server in ("cloud", "edge0", "edge1", "redis"):
        for host in (server, "localhost", "127.0.0.1", "fl.example.org", "10.1.2.3"):
            name = (x509.IPAddress(ipaddress.ip_address(host)) if host[0].isdigit() else x509.DNSName(host))
            policy.build_server_verifier(name).verify(load(out / f"{server}.pem"), [])
        with pytest.raises(VerificationError):
            policy.build_server_verifier(x509.DNSName("elsewhere.example.org")).verify(load(out / f"{server}.pem"), [])
    client_verifier = policy.build_client_verifier()
    for client in ("cloud", "edge0", "edge1", "admin", "client0", "client2"):  # who presents one (mutual TLS)
        client_verifier.verify(load(out / f"{client}.pem"), [])
    with pytest.raises(VerificationError):  # a device cannot pose as a server
        policy.build_server_verifier(x509.DNSName("localhost")).verify(load(out / "client0.pem"), [])
    days = load(out / "edge0.pem").not_valid_after_utc - load(out / "edge0.pem").not_valid_before_utc
    assert days.days == 30


def test_certs_does_not_replace_a_ca_unless_forced(tmp_path):
    assert _fedctl("certs", str(tmp_path), "--edges", "0", "--clients", "0").returncode == 0
    ca = (tmp_path / "ca.pem").read_bytes()
    again = _fedctl("certs", str(tmp_path), "--edges", "0", "--clients", "0")
    assert again.returncode == 1
    assert "ca.key exists" in again.stdout + again.stderr and "Traceback" not in again.stdout + again.stderr
    assert (tmp_path / "ca.pem").read_bytes() == ca
    assert _fedctl("certs", str(tmp_path), "--force", "--edges", "0", "--clients", "0").returncode == 0
    assert (tmp_path / "ca.pem").read_bytes() != ca
