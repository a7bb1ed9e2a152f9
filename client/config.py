from __future__ import annotations

from pathlib import Path

from pydantic import Field, model_validator
from pydantic_settings import SettingsConfigDict

from shared.settings import ServiceSettings


class ClientSettings(ServiceSettings):
    """Client settings: env FL_CLIENT_<NAME>, a TOML file named by FL_CLIENT_CONFIG_FILE, or CLI flags."""

    model_config = SettingsConfigDict(env_prefix="FL_CLIENT_", extra="forbid")

    edge_url: str = "http://127.0.0.1:8100"
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
    # Several identical processes can split `clients` between them (the pods of a Kubernetes StatefulSet,
    # which learn their index from the pod label apps.kubernetes.io/pod-index): this process hosts every
    # shard_count-th of the listed ids, starting at position shard_index. Stable across restarts, so each
    # id keeps its state directory; the default hosts them all.
    shard_index: int = Field(0, ge=0)
    shard_count: int = Field(1, ge=1)

    @model_validator(mode="after")
    def _shard_in_range(self) -> ClientSettings:
        if self.shard_index >= self.shard_count:
            raise ValueError(f"shard_index {self.shard_index} must be below shard_count {self.shard_count}")
        return self

    def hosted_ids(self) -> list[int]:
        """The logical client ids this process hosts: its shard of `clients`."""
        ids = parse_ids(self.clients)[self.shard_index::self.shard_count]
        if not ids:
            raise ValueError(f"shard {self.shard_index} of {self.shard_count} holds none of the clients "
                             f"{self.clients!r}")
        return ids


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
