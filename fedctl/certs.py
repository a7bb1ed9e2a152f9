"""`fedctl certs DIR`: a private CA and the certificates of one deployment, made with `cryptography`.

Files (PEM; every key readable by its owner only):
- ca.pem, ca.key: the CA. Every service and device is given ca.pem to verify its peer; ca.key signs the
  certificates and should then be kept offline.
- cloud.pem/.key, edge<i>.pem/.key, redis.pem/.key: server certificates, whose subject alternative names are
  the service's name (its host in docker-compose), localhost, 127.0.0.1 and every host given. They are valid
  for client authentication too: an edge presents its own to the cloud, the cloud its own to Redis (mutual
  TLS), and each service's health check in docker-compose.tls.yml its own to itself.
- client<k>.pem/.key: one client certificate per client device, and admin.pem/.key for the operator's fedctl
  (and probes such as a health check), client authentication only.
Keys are ECDSA P-256: small, and quick to sign and verify in every handshake.
"""
from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from fl_services.shared.runtime.files import write_private

DEFAULT_HOSTS = ("localhost", "127.0.0.1")


@dataclass(frozen=True)
class Issued:
    key: ec.EllipticCurvePrivateKey
    cert: x509.Certificate

    def write(self, directory: Path, name: str) -> tuple[Path, Path]:
        """`name`.pem and `name`.key in `directory`; the key is created readable by its owner only."""
        cert_path, key_path = directory / f"{name}.pem", directory / f"{name}.key"
        cert_path.write_bytes(self.cert.public_bytes(serialization.Encoding.PEM))
        key_pem = self.key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                         serialization.NoEncryption())
        write_private(key_path, key_pem)
        return cert_path, key_path


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "fl-services"),
                      x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _san(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def make_ca(days: int = 3650, common_name: str = "fl-services CA") -> Issued:
    key = ec.generate_private_key(ec.SECP256R1())
    start = datetime.now(UTC) - timedelta(minutes=5)  # a peer whose clock is a little behind accepts it too
    cert = (x509.CertificateBuilder().subject_name(_name(common_name)).issuer_name(_name(common_name))
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(start).not_valid_after(start + timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False, decipher_only=False),
                           critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256()))
    return Issued(key, cert)


def issue(ca: Issued, common_name: str, hosts: list[str] | tuple[str, ...] = (), *, server: bool,
          client: bool, days: int = 365, not_before: datetime | None = None) -> Issued:
    """A certificate `ca` signs, for a server (with `hosts` as its names), a client, or both; valid for `days`
    from `not_before` (default: now). Without hosts its name is `common_name`: strict validators (RFC 5280
    profiles such as the Web PKI's) require a subject alternative name in a client certificate too."""
    key = ec.generate_private_key(ec.SECP256R1())
    start = not_before or datetime.now(UTC) - timedelta(minutes=5)
    usages = [*([ExtendedKeyUsageOID.SERVER_AUTH] if server else []),
              *([ExtendedKeyUsageOID.CLIENT_AUTH] if client else [])]
    builder = (x509.CertificateBuilder().subject_name(_name(common_name)).issuer_name(ca.cert.subject)
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(start).not_valid_after(start + timedelta(days=days))
               .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
               .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=False, crl_sign=False,
                                            content_commitment=False, key_encipherment=False,
                                            data_encipherment=False, key_agreement=False, encipher_only=False,
                                            decipher_only=False), critical=True)
               .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
               .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.key.public_key()),
                              critical=False))
    names = [_san(h) for h in dict.fromkeys(hosts or [common_name])]
    builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    return Issued(key, builder.sign(ca.key, hashes.SHA256()))


def write_deployment(directory: Path, edges: int = 2, clients: int = 2, hosts: list[str] | tuple[str, ...] = (),
                     days: int = 365) -> dict[str, tuple[Path, Path]]:
    """The CA and every certificate of a deployment (see the module's doc) in `directory`: name -> paths."""
    directory.mkdir(parents=True, exist_ok=True)
    ca = make_ca(days=max(days, 3650))
    written = {"ca": ca.write(directory, "ca")}

    def server(name: str, client: bool) -> None:
        written[name] = issue(ca, name, (name, *DEFAULT_HOSTS, *hosts), server=True, client=client,
                              days=days).write(directory, name)

    server("cloud", client=True)  # and the client of Redis
    for i in range(edges):
        server(f"edge{i}", client=True)  # and the client of the cloud
    server("redis", client=True)  # and its own health check, a client of it
    for name in ("admin", *(f"client{k}" for k in range(clients))):
        written[name] = issue(ca, name, server=False, client=True, days=days).write(directory, name)
    return written
