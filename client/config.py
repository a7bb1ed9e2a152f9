from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from shared.settings import ServiceSettings


class ClientSettings(ServiceSettings):
    """Client settings: env FL_CLIENT_<NAME>, a TOML file named by FL_CLIENT_CONFIG_FILE, or CLI flags."""

    model_config = SettingsConfigDict(env_prefix="FL_CLIENT_", extra="forbid")

    edge_url: str = "http://127.0.0.1:8100"
    # An https:// edge_url is verified against this CA bundle (PEM; unset: the public CAs); with
    # edge_cert_file (and its key, unless in the same file) the process presents that certificate (mutual TLS).
    edge_ca_file: Path | None = None
    edge_cert_file: Path | None = None
    edge_key_file: Path | None = None
    client_token: str = "dev-client-token"
    # Logical clients this process hosts: "3", "0-4" or "0,2,5-7". A device usually hosts one.
    clients: str = "0"
    state_dir: Path = Path(".fl-state")
    # Overrides the run's npz path with this machine's copy of the federated dataset file.
    data_path: str | None = None
    long_poll_s: float = Field(20.0, gt=0)
    # A logical client whose loop fails (a malformed task, an error answer, an edge away for long) waits
    # retry_initial_s, doubling up to retry_max_s, then tries again; a success resets the wait.
    retry_initial_s: float = Field(1.0, gt=0)
    retry_max_s: float = Field(30.0, gt=0)


def parse_ids(spec: str) -> list[int]:
    ids: set[int] = set()
    for part in filter(None, (p.strip() for p in spec.split(","))):
        lo, _, hi = part.partition("-")
        start, end = int(lo), int(hi or lo)
        if start < 0 or end < start:
            raise ValueError(f"bad client range {part!r}")
        ids.update(range(start, end + 1))
    if not ids:
        raise ValueError("no client ids given")
    return sorted(ids)
