"""The base of each service's settings class: environment variables over a TOML file over defaults.

Each service (cloud, edge, client) has exactly one settings class with its own env prefix, e.g.
FL_CLOUD_REDIS_URL; FL_CLOUD_CONFIG_FILE names an optional TOML file with the same keys."""
from __future__ import annotations

import ipaddress
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar

from pydantic import Field, ValidationError
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsError, TomlConfigSettingsSource

from fl_services.shared.runtime.log import LogFormat


class ServiceSettings(BaseSettings):
    """What every service's settings hold: its torch threads and its logging."""

    torch_threads: int = Field(1, ge=1, description=(
        "Torch's intra-op threads for the service's tensor work (training, client_task, edge_aggregate, "
        "cloud_update); 1 by default, so that equal configs give equal models (docs/explanation-determinism.md)."))
    log_level: str = Field("info", description="The logging level: debug, info, warning, error or critical.")
    log_format: LogFormat = Field("text", description=(
        '"text": time, level, logger name, message; "json": one JSON object per line with time, level, logger, '
        "message and, where known, run_id, edge_id and client_id (shared/runtime/log.py)."))

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        prefix = settings_cls.model_config.get("env_prefix", "")
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings, SettingFiles(settings_cls)]
        config_file = os.environ.get(f"{prefix}CONFIG_FILE")
        if config_file:
            sources.append(TomlConfigSettingsSource(settings_cls, toml_file=config_file))
        return tuple(sources)


class SettingFiles(PydanticBaseSettingsSource):
    """`<PREFIX><NAME>_FILE=path` (e.g. FL_CLOUD_ADMIN_TOKEN_FILE=/run/secrets/admin_token): the setting is that
    file's content, its final newline dropped. Docker secrets arrive as such files, so a token need not
    sit in an environment variable (visible to `docker inspect` and every process of the container) nor
    in a compose file. The variable itself (FL_CLOUD_ADMIN_TOKEN) wins where both are set."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        raise NotImplementedError  # __call__ reads every field at once

    def __call__(self) -> dict[str, Any]:
        prefix = self.settings_cls.model_config.get("env_prefix", "")
        values: dict[str, Any] = {}
        for name, field in self.settings_cls.model_fields.items():
            variable = f"{prefix}{name.upper()}_FILE"
            path = os.environ.get(variable)
            if not path:
                continue
            try:
                text = Path(path).read_text().removesuffix("\n").removesuffix("\r")
                # A dict or list setting (e.g. the cloud's admin_tokens) is JSON, as in its variable.
                values[name] = self.decode_complex_value(name, field, text) if self.field_is_complex(field) else text
            except (OSError, UnicodeDecodeError, ValueError) as exc:
                raise SettingsError(f"{variable}={path}: cannot read it: {exc}") from exc
        return values


# The tokens the settings default to, and placeholders of the change-me kind: anyone who has read this
# repository knows them.
DEVELOPMENT_TOKENS = frozenset({"dev-admin-token", "dev-edge-token", "dev-client-token"})


# A TLS triple of a settings class (the CA bundle a peer is verified against, the certificate presented to it, its
# key): each class names its own (FL_CLIENT_EDGE_CA_FILE, FL_EDGE_CLOUD_CA_FILE, ...), the fields say it alike.
def ca_file_field(verified: str) -> Any:
    """The CA bundle setting that `verified` (e.g. "an https:// edge_url") is verified against."""
    return Field(None, description=f"CA bundle (PEM) {verified} is verified against (unset: the public CAs).")


def cert_file_field(presenter: str, peer: str) -> Any:
    """The certificate setting `presenter` presents to `peer` (mutual TLS)."""
    return Field(None, description=f"Certificate (PEM) {presenter} presents to {peer} (mutual TLS).")


def key_file_field(cert_field: str) -> Any:
    """The key setting of the certificate setting `cert_field`."""
    return Field(None, description=f"The key of {cert_field} (unset: it is in the same file).")


def is_development_token(token: str) -> bool:
    return token in DEVELOPMENT_TOKENS or token.startswith("change-me")


def is_loopback(host: str) -> bool:
    """Whether a server bound to `host` is reachable from this machine only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # another host name: it may resolve to anything
        return False


S = TypeVar("S", bound=BaseSettings)


def load_settings(settings_cls: type[S], **values: Any) -> S:
    """The service's settings (`values`, e.g. command-line options, over every other source), or exit with one
    line per problem (status 1). Never pydantic's own report: it repeats the input, tokens included."""
    try:
        return settings_cls(**values)
    except ValidationError as exc:
        prefix = settings_cls.model_config.get("env_prefix", "")
        problems = [(f"{prefix}{str(e['loc'][0]).upper()}: " if e["loc"] else "")
                    + e["msg"].removeprefix("Value error, ")
                    for e in exc.errors(include_url=False, include_input=False)]
        raise SystemExit("invalid settings: " + "; ".join(problems)) from None
    except SettingsError as exc:
        raise SystemExit(f"invalid settings: {exc}") from None


def settings_help(settings_cls: type[BaseSettings]) -> str:
    """The settings a service reads, from its settings class itself (so the help cannot drift from it): each as
    its environment variable with its default, then the file variants."""
    prefix = settings_cls.model_config.get("env_prefix", "")
    lines = ["Settings (environment variables; a TOML file named by "
             f"{prefix}CONFIG_FILE may hold the same keys in lower case, without the prefix):"]
    for name, field in settings_cls.model_fields.items():
        default = field.get_default(call_default_factory=True)
        shown = "unset" if default is None else json.dumps(default, default=str)
        lines.append(f"  {prefix}{name.upper()}  (default {shown})")
    lines.append(f"Any of them from a file instead (a Docker secret): {prefix}<NAME>_FILE=path.")
    return "\n".join(lines)


def answer_help(settings_cls: type[BaseSettings], usage: str, argv: Sequence[str] | None = None) -> None:
    """For a service configured by its environment alone: `-h`/`--help` prints `usage` and the settings and
    exits 0, any other argument is refused (status 2); either way before anything starts. No argument: returns."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        return
    if args in (["-h"], ["--help"]):
        print(f"{usage}\n\n{settings_help(settings_cls)}")
        raise SystemExit(0)
    print(f"{usage}\n\nerror: it takes no arguments ({' '.join(args)!r}): its settings come from the environment "
          "(--help lists them)", file=sys.stderr)
    raise SystemExit(2)
