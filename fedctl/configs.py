"""Run configs from files: JSON, TOML or YAML (YAML where pyyaml is installed), each error naming the file and,
where the parser knows it, the line."""
from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the model (and pydantic) only where a config is read: `fedctl --help` needs neither
    from fl_services.shared.core.config import RunConfig


class ConfigFileError(ValueError):
    """A config file that cannot be read as a run config: the message names the file (and line)."""


def read_config_file(path: Path) -> dict[str, Any]:
    """The settings a config file holds, by its suffix: .toml, .yaml/.yml, anything else JSON."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigFileError(f"{path}: cannot read it: {exc.strerror or exc}") from None
    suffix = path.suffix.lower()
    if suffix == ".toml":
        try:
            data: Any = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:  # its message ends "(at line L, column C)"
            raise ConfigFileError(f"{path}: not valid TOML: {exc}") from None
    elif suffix in (".yaml", ".yml"):
        data = _yaml(path, text)
    else:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigFileError(f"{path}:{exc.lineno}:{exc.colno}: not valid JSON: {exc.msg}"
                                  + (" (a YAML or TOML file needs its .yaml or .toml suffix)"
                                     if suffix != ".json" else "")) from None
    if not isinstance(data, dict):  # a list or a string
        raise ConfigFileError(f"{path}: a run config is a JSON object of settings, not a {type(data).__name__}")
    return data


def _yaml(path: Path, text: str) -> Any:
    try:
        import yaml  # optional: only YAML configs need it
    except ImportError:
        raise ConfigFileError(f"{path}: reading YAML needs the pyyaml package (pip install pyyaml); or write the "
                              "config as .json or .toml") from None
    # YAML 1.1 (PyYAML) reads 1e-3 as a string, which a number field refuses (shared/core/numbers.py): such an
    # exponent without a dot is a float, as YAML 1.2, JSON and TOML read it.
    class Loader(yaml.SafeLoader):
        pass

    Loader.add_implicit_resolver("tag:yaml.org,2002:float", re.compile(r"^[-+]?(?:\d+\.?\d*|\.\d+)[eE][-+]?\d+$"),
                                 list("-+0123456789."))
    try:
        return yaml.load(text, Loader=Loader)  # a SafeLoader: no object is built from the text
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f":{mark.line + 1}:{mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigFileError(f"{path}{where}: not valid YAML: {problem}") from None


def load_config(path: Path | None, **overrides: Any) -> RunConfig:
    """The RunConfig of a file (None: the defaults) with `overrides` (those not None) on top, checked against its
    algorithm as the cloud checks it."""
    from pydantic import ValidationError

    from fl_services.shared.core.algorithms import registry

    data = read_config_file(path) if path is not None else {}
    data.update({k: v for k, v in overrides.items() if v is not None})
    try:
        return registry.parse_config(data)
    except ValidationError as exc:
        raise ConfigFileError(f"{path or 'the config'}: " + validation_summary(exc)) from None


def validation_summary(exc: Any) -> str:
    """pydantic's errors in one line, each at its location (`topology.buffer_size: ...`), without the input."""
    parts = []
    for error in exc.errors(include_url=False, include_input=False):
        where = ".".join(str(part) for part in error["loc"])
        message = error["msg"].removeprefix("Value error, ")
        parts.append(f"{where}: {message}" if where else message)
    return "; ".join(parts)
