from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Self
from urllib.parse import urlsplit

from pydantic import Field, model_validator
from pydantic_settings import SettingsConfigDict

from fl_services.shared.core.device_setting import DeviceSetting
from fl_services.shared.runtime.settings import ca_file_field, cert_file_field, is_loopback, key_file_field
from fl_services.shared.server.settings import ServerSettings
from fl_services.shared.wire.protocol import same_token

if TYPE_CHECKING:
    import torch


class CloudSettings(ServerSettings):
    """Cloud settings: env FL_CLOUD_<NAME>, or a TOML file named by FL_CLOUD_CONFIG_FILE."""

    model_config = SettingsConfigDict(env_prefix="FL_CLOUD_", extra="forbid")

    host: str = Field("127.0.0.1", description=(
        "The address to listen on. Beyond loopback (0.0.0.0, a LAN address) the development tokens are refused."))
    port: int = Field(8000, description="The port to listen on.")
    storage: Literal["redis", "memory"] = Field("redis", description=(
        "Where the cloud keeps its state: redis (the redis_* settings; survives restarts, shared by replicas), or "
        "memory (this process only, lost when it stops: a single-process development cloud, refused beyond "
        "loopback)."))
    redis_url: str = Field("redis://127.0.0.1:6379/0", description=(
        "redis://[[USER]:PASSWORD@]HOST:PORT/DB: a password (requirepass) or an ACL user and its password; "
        "rediss:// for TLS, verified against redis_ca_file (unset: the public CAs), presenting redis_cert_file "
        "(and its key, unless in the same file) to a Redis that requires client certificates (tls-auth-clients)."))
    redis_password: str | None = Field(None, description=(
        "Redis' password (requirepass, or the password of the URL's ACL user) apart from the URL, so that it can "
        "come from a file of its own (FL_CLOUD_REDIS_PASSWORD_FILE: the Docker secret Redis reads too); not both."))
    redis_ca_file: Path | None = ca_file_field("a rediss:// Redis")
    redis_cert_file: Path | None = cert_file_field("the cloud", "a rediss:// Redis that requires client certificates")
    redis_key_file: Path | None = key_file_field("redis_cert_file")
    redis_max_connections: int = Field(64, ge=1, description=(
        "The Redis connections this process's requests and loop open at most (its event channel has one of its "
        "own besides); a request that finds them all busy waits up to redis_pool_timeout_s for one, then answers "
        "503 (edges retry). Long-polls hold none while they wait."))
    redis_pool_timeout_s: float = Field(30.0, gt=0, description=(
        "How long a request waits for a free Redis connection before it answers 503."))
    key_prefix: str = Field("fl", description=(
        "Every key lives under this prefix, so several clouds (or test sessions) can share one Redis."))
    blob_dir: Path | None = Field(None, description=(
        "A directory for contributions' blobs, on a volume every replica mounts at this path: each blob is written "
        "there, fsynced, before its submit is buffered, and only its name goes into Redis (a write at disk speed, "
        "where storing the bytes in Redis waits for its AOF). Unset: the blobs are kept in Redis. Replicas must "
        "all set it, or all leave it unset, once contributions are buffered in files. A directory the cloud cannot "
        "create or write stops it at start-up."))
    blob_orphan_s: float = Field(3600.0, gt=0, description=(
        "A blob file that no buffered contribution references (its cloud stopped between the write and the "
        "buffering) is deleted once it is this many seconds old; checked at start and every quarter of it."))
    admin_token: str = Field("dev-admin-token", description=(
        'The administrator\'s bearer token (the control API, the dashboard); named "admin" in the audit log.'))
    admin_tokens: dict[str, str] = Field(default_factory=dict, description=(
        'Further administrators\' tokens, by name (JSON: {"alice": "<token>"}): each is accepted as the admin '
        'token is, and the audit log names who acted ("admin" for admin_token).'))
    edge_token: str = Field("dev-edge-token", description="The bearer token the edges present.")
    max_payload_bytes: int = Field(64 * 2**20, gt=0, description=(
        "The largest body a tensor route (an edge's contribution) accepts: 413 beyond."))
    max_state_bytes: int = Field(500 * 2**20, gt=0, description=(
        "A run's global state and its server memory are each one Redis value, which Redis caps at 512 MiB "
        "(proto-max-bulk-len): a run whose memory would not fit is refused at creation."))
    long_poll_max_s: float = Field(25.0, gt=0, description=(
        "The longest an edge's long-poll (the next global state, a run's end) is held: a longer timeout asked is "
        "cut to this, after which it is answered 204."))
    lease_s: float = Field(10.0, gt=0, description=(
        "Several replicas may share one Redis (behind a load balancer): each serves every API, and a lease in "
        "Redis lets one of them compute each cloud update. A replica that dies holding it (killed, its host "
        "lost) delays that update by at most lease_s, after which another takes it over; a live one renews it "
        "every lease_s / 3."))
    replica_id: str = Field("", description="Names the replica in the history and the logs (empty: host:pid).")
    max_update_failures: int = Field(10, ge=1, description=(
        "A run whose cloud update fails this many times in a row (an error that is not Redis being away, which "
        "every run waits out alike) is stopped, its buffer kept: an update that fails the same way each time "
        "would otherwise be retried for ever."))
    allowed_imports: str = Field("", description=(
        'Comma-separated packages whose "package.module:function" a run config may name as its model factory or '
        "data loader (importing it runs that code here); empty: any importable package."))
    create_timeout_s: float = Field(120.0, gt=0, description=(
        "How long creating a run may take to load its data and build its model (user code included) before it "
        "is refused (422): a loader that never returns must not hold the request, nor threads others need."))
    device: DeviceSetting = Field("cpu", description=(
        "Where the cloud evaluates the global model and trains hfpl's classifier: cpu, cuda, cuda:N or auto (as "
        "the client's FL_CLIENT_DEVICE); a GPU this machine does not have stops the cloud at start-up."))

    @model_validator(mode="after")
    def _memory_storage_on_loopback_only(self) -> Self:
        # Its state dies with the process and no replica shares it: a development cloud, never a service.
        if self.storage == "memory" and not is_loopback(self.host):
            raise ValueError(f"FL_CLOUD_STORAGE=memory keeps every run in this one process, lost when it stops, "
                             f"and the cloud listens on {self.host}, beyond loopback: listen on 127.0.0.1 for "
                             "development, or keep the state in Redis (FL_CLOUD_STORAGE=redis)")
        return self

    @model_validator(mode="after")
    def _blob_files_beside_redis(self) -> Self:
        if self.blob_dir is not None and self.storage != "redis":
            raise ValueError("blob_dir keeps contributions' blobs in files shared by the replicas of a cloud on "
                             "Redis; FL_CLOUD_STORAGE=memory keeps them in this process: unset blob_dir")
        if self.blob_dir is not None and (self.key_prefix in ("", ".", "..") or "/" in self.key_prefix):
            raise ValueError(f"key_prefix {self.key_prefix!r} names the blob directory's subdirectory: use a name "
                             "without '/'")
        return self

    @model_validator(mode="after")
    def _redis_tls_needs_rediss(self) -> Self:
        given = [name for name in ("redis_ca_file", "redis_cert_file", "redis_key_file") if getattr(self, name)]
        if given and urlsplit(self.redis_url).scheme != "rediss":
            raise ValueError(f"{', '.join(given)} given, but redis_url is not rediss:// (Redis over TLS)")
        return self

    @model_validator(mode="after")
    def _one_redis_password(self) -> Self:
        if self.redis_password is not None and urlsplit(self.redis_url).password is not None:
            raise ValueError("redis_password given, but redis_url holds a password too: give one of them")
        return self

    def redis_options(self) -> dict[str, Any]:
        """redis-py's options besides `redis_url`: its password, and the TLS files (only a rediss:// connection
        takes them)."""
        files = {"ssl_ca_certs": self.redis_ca_file, "ssl_certfile": self.redis_cert_file,
                 "ssl_keyfile": self.redis_key_file}
        password = {} if self.redis_password is None else {"password": self.redis_password}
        return {option: str(path) for option, path in files.items() if path is not None} | password

    audit_max_entries: int = Field(10_000, ge=1, description=(
        "The audit log (GET /api/v1/audit) keeps about this many of the latest admin actions (a capped stream)."))
    retain_days: float | None = Field(None, gt=0, description=(
        "Runs ended (stopped or finished) more than this many days ago are deleted, checked every "
        "retention_interval_s; unset: kept for good."))
    retain_runs: int | None = Field(None, ge=0, description=(
        "All but the latest this many ended runs are deleted, checked every retention_interval_s; unset: kept "
        "for good."))
    retention_interval_s: float = Field(300.0, gt=0, description="How often retention is checked, in seconds.")
    admission_interval_s: float = Field(1.0, gt=0, description=(
        "How often waiting runs (a selection's) are checked for their devices: admitted, or failed past their "
        "timeout."))

    @model_validator(mode="after")
    def _one_name_per_token(self) -> Self:
        # The audit log names whose token acted: a token under two names would be recorded as the first of
        # them, a named one equal to the edge token would make every edge an administrator, and a token named
        # "admin" would silently replace admin_token.
        if "admin" in self.admin_tokens:
            raise ValueError('admin_tokens: "admin" is admin_token\'s name in the audit log; choose another name')
        tokens = [self.admin_token, *self.admin_tokens.values(), self.edge_token]
        if len(set(tokens)) != len(tokens):
            raise ValueError("admin_token, admin_tokens and edge_token must all differ: the audit log names "
                             "who acted by the token used")
        return self

    @model_validator(mode="after")
    def _secret_tokens_beyond_loopback(self) -> "CloudSettings":
        self.refuse_development_tokens(self.host, {"admin_token": self.admin_token, "edge_token": self.edge_token,
                                                   **{f"admin_tokens.{n}": t for n, t in self.admin_tokens.items()}})
        return self

    def admin_name(self, token: str) -> str | None:
        """Whose admin token `token` is ("admin": admin_token), or None."""
        named = {"admin": self.admin_token, **self.admin_tokens}
        # Every token compared (no early exit): the time taken says nothing about which one nearly matched.
        matches = [name for name, expected in named.items() if same_token(token, expected)]
        return matches[0] if matches else None

    @property
    def compute_device(self) -> torch.device:
        from fl_services.shared.core.device import resolve  # torch: only where the service starts computing
        return resolve(self.device)

    @property
    def replica(self) -> str:
        return self.replica_id or f"{socket.gethostname()}:{os.getpid()}"

    @property
    def allowed_import_prefixes(self) -> tuple[str, ...]:
        return tuple(p.strip() for p in self.allowed_imports.split(",") if p.strip())
