from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Literal
from urllib.parse import urlsplit

from pydantic import Field, TypeAdapter, field_validator, model_validator
from pydantic_settings import SettingsConfigDict

from fl_services.shared.core.data import parse_source
from fl_services.shared.core.device_setting import DeviceSetting
from fl_services.shared.core.reports import Labels, parse_labels
from fl_services.shared.runtime.settings import ServiceSettings, ca_file_field, cert_file_field, key_file_field
from fl_services.shared.wire.protocol import issued_token_parts

if TYPE_CHECKING:
    import torch


class ClientSettings(ServiceSettings):
    """Client settings: env FL_CLIENT_<NAME>, a TOML file named by FL_CLIENT_CONFIG_FILE, or CLI flags."""

    model_config = SettingsConfigDict(env_prefix="FL_CLIENT_", extra="forbid")

    edge_url: str = Field("http://127.0.0.1:8100", description="Where the process reaches its edge (it dials out).")
    edge_ca_file: Path | None = ca_file_field("an https:// edge_url")
    edge_cert_file: Path | None = cert_file_field("the process", "the edge")
    edge_key_file: Path | None = key_file_field("edge_cert_file")
    client_token: str = Field("dev-client-token", description=(
        "The bearer token every hosted client sends: the edges' client secret, or, for a process hosting one "
        "client, that client's own device token."))
    client_tokens: dict[int, str] = Field(default_factory=dict, description=(
        'One token per logical client (JSON: {"0": "fl1.0.<id>.<mac>", "2": ...}), as `fedctl issue-token 0,2 '
        "--out FILE` writes them: given, each hosted client uses its own (and every hosted client needs one), "
        "so the process need not hold the edges' client secret, and revoking one token stops that client alone. "
        "Usually from a file: FL_CLIENT_CLIENT_TOKENS_FILE (a Docker secret)."))
    clients: str = Field("0", description=(
        'Logical clients this process hosts: "3", "0-4" or "0,2,5-7". A device usually hosts one.'))
    state_dir: Path = Field(Path(".fl-state"), description=(
        "Where each hosted client keeps its state (<run>/client-<k>/), written atomically and fsynced."))
    data_path: str | None = Field(None, description=(
        "Overrides the run's npz path with this machine's copy of the federated dataset file."))
    data: str | None = Field(None, description=(
        'The device\'s own data, a source spec (shared/core/data/specs.py), e.g. "npz:/data/site.npz" or '
        '"image-folder:/data/imgs?shape=1x28x28": tasks train on its training split, whatever the run\'s data set. '
        "For a process hosting one device (one logical client). Unset: each client trains on its partition of the "
        "run's data set."))
    labels: str = Field("", description=(
        'The device\'s labels, e.g. "region=eu,site=lyon", registered with it: a run\'s device selection may name '
        "them."))
    long_poll_s: float = Field(20.0, gt=0, description="How long the process's task long-poll asks to be held.")
    retry_initial_s: float = Field(1.0, gt=0, description=(
        "A logical client whose loop fails (a malformed task, an error answer, an edge away for long) waits "
        "retry_initial_s, doubling up to retry_max_s, then tries again; a success resets the wait."))
    retry_max_s: float = Field(30.0, gt=0, description="The longest wait between a failing client's attempts.")
    dvfs_backend: Literal["auto", "cpufreq", "emulate"] = Field("auto", description=(
        "DVFS (client/dvfs.py): auto sets the host's CPU frequency where cpufreq under cpufreq_root is writable "
        "by this process, and emulates the device's time otherwise; cpufreq insists, emulate never touches it."))
    cpufreq_root: Path = Field(Path("/sys/devices/system/cpu/cpufreq"), description=(
        "Where the host's cpufreq policies are."))
    shard_index: int = Field(0, ge=0, description=(
        "Several identical processes can split `clients` between them (the pods of a Kubernetes StatefulSet, "
        "which learn their index from the pod label apps.kubernetes.io/pod-index): this process hosts every "
        "shard_count-th of the listed ids, starting at position shard_index. Stable across restarts, so each "
        "id keeps its state directory; the default hosts them all."))
    shard_count: int = Field(1, ge=1, description="How many processes split `clients` (see shard_index).")
    device: DeviceSetting = Field("cpu", description=(
        "Where local training runs: cpu, cuda (the current GPU), cuda:N, or auto (cuda where torch sees a GPU, else "
        "cpu); a GPU this machine does not have stops the process at start-up. Results travel as a CPU client's do "
        "(shared/core/device.py); a GPU's are not bit-identical to the CPU's (docs/explanation-determinism-gpu.md)."))

    @field_validator("edge_url")
    @classmethod
    def _edge_url_has_a_scheme(cls, url: str) -> str:
        # "edge:8100" parses as scheme "edge": without this, every request failed and was retried for ever.
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            bare = url.split("://", 1)[-1]
            raise ValueError(f"{url!r} is not an http:// or https:// URL: give the scheme, e.g. http://{bare}")
        return url

    @field_validator("data")
    @classmethod
    def _data_source(cls, spec: str | None) -> str | None:
        if spec is not None:
            parse_source(spec)  # a spec that names nothing readable fails at start-up, saying why
        return spec

    @property
    def label_map(self) -> dict[str, str]:
        return parse_labels(self.labels)

    @model_validator(mode="after")
    def _labels_parse(self) -> ClientSettings:
        TypeAdapter(Labels).validate_python(self.label_map)  # a malformed label fails at start-up, saying which
        return self

    @model_validator(mode="after")
    def _shard_in_range(self) -> ClientSettings:
        if self.shard_index >= self.shard_count:
            raise ValueError(f"shard_index {self.shard_index} must be below shard_count {self.shard_count}")
        return self

    @model_validator(mode="after")
    def _tokens_name_their_clients(self) -> ClientSettings:
        # An issued token names its client: one filed under another id is a mix-up the edge would refuse
        # (401, which ends that client), so say so at start-up instead.
        for client_id, token in self.client_tokens.items():
            parts = issued_token_parts(token)
            if parts is not None and parts[0] != client_id:
                raise ValueError(f"client_tokens: the token given for client {client_id} is client {parts[0]}'s")
        return self

    @property
    def compute_device(self) -> torch.device:
        from fl_services.shared.core.device import resolve  # torch: only where the service starts computing
        return resolve(self.device)

    def hosted_ids(self) -> list[int]:
        """The logical client ids this process hosts: its shard of `clients`."""
        ids = parse_ids(self.clients)[self.shard_index::self.shard_count]
        if not ids:
            raise ValueError(f"shard {self.shard_index} of {self.shard_count} holds none of the clients "
                             f"{self.clients!r}")
        if self.data is not None and len(ids) > 1:
            raise ValueError(f"data names one device's own data: host one client with it, not {len(ids)} "
                             f"({self.clients!r})")
        missing = ", ".join(str(k) for k in ids if self.client_tokens and k not in self.client_tokens)
        if missing:
            raise ValueError(f"client_tokens holds no token for client(s) {missing} of those this process hosts")
        return ids

    def token_of(self, client_id: int) -> str:
        """The bearer token logical client `client_id` sends: its own if client_tokens is given."""
        return self.client_tokens.get(client_id, self.client_token)


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
