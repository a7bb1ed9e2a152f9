"""Static checks of docker-compose.yml and docker/Dockerfile.* against the code they run.

No Docker engine is needed: the compose file is parsed with PyYAML and compared with the service
packages and their settings classes, so a renamed settings field, entry point or package breaks
these tests instead of a container at start-up.
"""
from __future__ import annotations

import ast
import json
import os
import re
import shlex
import ssl
import subprocess
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import jsonschema
import pytest
import redis
import yaml  # noqa: E402  (requirements-dev.txt)

from fl_services.client.config import parse_ids  # noqa: E402
from fl_services.fedctl.certs import write_deployment  # noqa: E402
from fl_services.fedctl.redis_server import free_port  # noqa: E402
from fl_services.shared.wire.protocol import device_token_id, issue_device_tokens, tokens_file_text  # noqa: E402
from tests.deployment import SETTINGS  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
COMPOSE_FILE = ROOT / "docker-compose.yml"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
# console script -> "package.module:function"
SCRIPTS: dict[str, str] = PYPROJECT["project"]["scripts"]
# What the wheel is built from: the import package and the directories its links point at.
TOP_LEVEL = {"fl_services", *(package.split(".")[1] for package in PYPROJECT["tool"]["setuptools"]["packages"]
                              if package.count(".") == 1)}
TORCH_PIN = "torch==2.13.0"
CPU_INDEX = "https://download.pytorch.org/whl/cpu"

PREFIXES = {prefix: pkg for pkg, (prefix, _) in SETTINGS.items()}


# --- helpers ---------------------------------------------------------------------------------

def load_compose() -> dict:
    return yaml.safe_load(COMPOSE_FILE.read_text())


class Reset:
    """Compose's `!reset` (2.24.4 and later): the key is removed from what the files before had set."""


@dataclass(frozen=True)
class Override:
    """Compose's `!override`: the value replaces what the files before had set instead of merging with it."""

    value: Any


class ComposeLoader(yaml.SafeLoader):
    """PyYAML's safe loader with Compose's two merge tags."""


def _override(loader: yaml.SafeLoader, node: yaml.Node) -> Override:
    if isinstance(node, yaml.SequenceNode):
        return Override(loader.construct_sequence(node, deep=True))
    if isinstance(node, yaml.MappingNode):
        return Override(loader.construct_mapping(node, deep=True))
    return Override(loader.construct_scalar(node))  # type: ignore[arg-type]


ComposeLoader.add_constructor("!reset", lambda loader, node: Reset())
ComposeLoader.add_constructor("!override", _override)


COMPOSE = load_compose()
SERVICES: dict[str, dict] = COMPOSE["services"]
# The TLS variant, docker/docker-compose.tls.yml, is an override of this file (merged below).
TLS_FILE = ROOT / "docker" / "docker-compose.tls.yml"
TLS_OVERRIDE = yaml.load(TLS_FILE.read_text(), Loader=ComposeLoader)  # noqa: S506 (a safe loader)


def merge(base: Any, override: Any, key: str = "") -> Any:
    """`docker compose -f base -f override`, for what these files hold: mappings merge key by key (`!reset`
    removes one), a service's volumes and secrets by their target, `!override` and any other value (a command,
    a healthcheck's test) replace."""
    if isinstance(override, Override):
        return override.value
    if isinstance(base, dict) and isinstance(override, dict):
        return {k: merge(base[k], v, k) if k in base else v for k, v in override.items()
                if not isinstance(v, Reset)} | {k: v for k, v in base.items() if k not in override}
    if key in ("volumes", "secrets") and isinstance(base, list) and isinstance(override, list):
        targets = {merge_target(key, v) for v in override}
        return [v for v in base if merge_target(key, v) not in targets] + override
    return override


def merge_target(key: str, entry: Any) -> str:
    """What Compose merges a volume (its container path) or a secret (its name in /run/secrets) by."""
    if isinstance(entry, dict):
        return str(entry.get("target") or entry["source"])
    return str(entry).split(":")[1] if key == "volumes" else str(entry)


TLS_COMPOSE: dict[str, Any] = merge(COMPOSE, TLS_OVERRIDE)
BUILT = sorted(name for name, svc in SERVICES.items() if "build" in svc)

_VAR = re.compile(r"\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?+])(?P<arg>[^}]*))?\}")


def interpolate(value: str) -> str:
    """Compose interpolation with an empty environment: ${VAR:-default} / ${VAR-default} -> default."""
    def sub(m: re.Match) -> str:
        op = m.group("op")
        if op in (":-", "-"):
            return m.group("arg")
        if op in (":?", "?"):
            raise AssertionError(f"{m.group(0)} requires {m.group('name')} to be set")
        return ""
    return _VAR.sub(sub, str(value)).replace("$$", "$")


def environment(service: dict) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) if "=" in item else (item, "") for item in env)
    return {key: "" if value is None else str(value) for key, value in env.items()}


def dockerfile_path(service: dict) -> Path:
    build = service["build"]
    if isinstance(build, str):
        return ROOT / build / "Dockerfile"
    return ROOT / build.get("context", ".") / build.get("dockerfile", "Dockerfile")


def instructions(dockerfile: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, with line continuations joined and comments dropped."""
    text = re.sub(r"\\\n", " ", dockerfile.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        keyword, _, args = line.partition(" ")
        out.append((keyword.upper(), args.strip()))
    return out


def build_args(dockerfile: Path) -> dict[str, str]:
    """The defaults of the Dockerfile's ARG instructions."""
    return dict(args.split("=", 1) for keyword, args in instructions(dockerfile) if keyword == "ARG" and "=" in args)


def cmd_of(dockerfile: Path) -> list[str]:
    cmds = [args for keyword, args in instructions(dockerfile) if keyword == "CMD"]
    assert cmds, f"{dockerfile.name} has no CMD"
    cmd = json.loads(cmds[-1])  # exec form only: no shell in between, signals reach python
    assert isinstance(cmd, list), cmd
    return cmd


def package_of(service_name: str) -> str:
    """The service package a built service runs, from its Dockerfile's CMD: one of the installed
    package's console scripts, e.g. `fl-cloud` -> fl_services.cloud.main:main -> cloud."""
    cmd = cmd_of(dockerfile_path(SERVICES[service_name]))
    assert len(cmd) == 1 and cmd[0] in SCRIPTS, f"{service_name}: CMD {cmd} is not a console script"
    module, _ = SCRIPTS[cmd[0]].split(":")
    assert module.endswith(".main"), module
    return module.removesuffix(".main").removeprefix("fl_services.")


def services_running(pkg: str) -> list[str]:
    return [name for name in BUILT if package_of(name) == pkg]


def healthcheck_snippets(service: dict) -> list[str]:
    test = service["healthcheck"]["test"]
    if isinstance(test, str):
        test = ["CMD-SHELL", test]
    if "-c" in test:
        return [test[test.index("-c") + 1]]
    return []


# --- compose structure -----------------------------------------------------------------------

def test_compose_has_no_version_key_and_expected_services():
    assert "version" not in COMPOSE  # obsolete in the compose spec
    assert {"redis", "cloud", "edge0", "edge1"} <= set(SERVICES)
    assert services_running("cloud") == ["cloud"]
    assert len(services_running("edge")) >= 1
    assert len(services_running("client")) >= 1
    monitoring = {name for name, service in SERVICES.items() if "monitoring" in service.get("profiles", [])}
    assert set(BUILT) == set(SERVICES) - {"redis"} - monitoring  # tests/test_monitoring.py checks those


def test_redis_persists_with_append_only_file():
    redis = SERVICES["redis"]
    assert redis["image"].startswith("redis:7")
    command = redis["command"]
    args = shlex.split(command) if isinstance(command, str) else list(command)
    assert args[0] == "redis-server"
    assert args[args.index("--appendonly") + 1] == "yes"
    assert args[args.index("--appendfsync") + 1] == "always"  # no accepted contribution lost in a host crash
    # Said, not left to the image's build (the official one compiles it off, Debian's has it on).
    assert args[args.index("--protected-mode") + 1] == "no"
    volume = next(v for v in redis["volumes"] if v.split(":")[1] == "/data")
    assert volume.split(":")[0] in (COMPOSE.get("volumes") or {})  # a named volume, not a bind mount
    assert redis["healthcheck"]["test"][-2:] == ["redis-cli", "ping"]


def test_every_service_but_clients_has_a_healthcheck():
    clients = set(services_running("client"))
    for name, service in SERVICES.items():
        if name in clients:
            continue
        check = service.get("healthcheck")
        assert check and check.get("test") and not check.get("disable"), f"{name} has no healthcheck"


@pytest.mark.parametrize("name", [n for n in BUILT if package_of(n) != "client"])
def test_http_healthchecks_probe_the_service_port(name):
    prefix, _ = SETTINGS[package_of(name)]
    port = environment(SERVICES[name])[f"{prefix}PORT"]
    snippets = healthcheck_snippets(SERVICES[name])
    assert snippets, f"{name}: healthcheck is not a python -c probe"
    for code in snippets:
        compile(code, f"<{name} healthcheck>", "exec")
        assert f"127.0.0.1:{port}/health" in code


def test_depends_on_points_at_defined_services():
    for name, service in SERVICES.items():
        deps = service.get("depends_on") or {}
        if isinstance(deps, list):
            deps = {dep: {"condition": "service_started"} for dep in deps}
        for dep, spec in deps.items():
            assert dep in SERVICES and dep != name, f"{name} depends on unknown service {dep}"
            if spec.get("condition") == "service_healthy":
                assert "healthcheck" in SERVICES[dep], f"{name} waits for {dep} to be healthy; it has no healthcheck"
    assert "redis" in SERVICES["cloud"]["depends_on"]
    for edge in services_running("edge"):
        assert "cloud" in SERVICES[edge]["depends_on"]


def test_named_volumes_are_declared():
    declared = set(COMPOSE.get("volumes") or {})
    for name, service in SERVICES.items():
        for volume in service.get("volumes") or []:
            source = volume.split(":")[0] if isinstance(volume, str) else volume.get("source")
            if not source.startswith((".", "/", "~")):
                assert source in declared, f"{name} mounts undeclared volume {source}"


def test_published_host_ports_are_unique():
    host_ports = [str(p).split(":")[-2] for s in SERVICES.values() for p in s.get("ports") or [] if ":" in str(p)]
    assert len(host_ports) == len(set(host_ports)), host_ports


# --- Dockerfiles -----------------------------------------------------------------------------

@pytest.mark.parametrize("name", BUILT)
def test_dockerfile_runs_an_existing_main(name):
    dockerfile = dockerfile_path(SERVICES[name])
    assert dockerfile.is_file(), dockerfile
    pkg = package_of(name)
    assert pkg in SETTINGS, f"{name}: unexpected package {pkg}"
    main_py = ROOT / pkg / "main.py"
    assert main_py.is_file(), main_py
    tree = ast.parse(main_py.read_text())
    defines_main = any(isinstance(node, ast.FunctionDef) and node.name == "main" for node in tree.body)
    assert defines_main, f"{main_py} defines no main()"
    assert dockerfile.name == f"Dockerfile.{pkg}"


@pytest.mark.parametrize("name", BUILT)
def test_dockerfile_installs_the_package_and_runs_its_console_script(name):
    dockerfile = dockerfile_path(SERVICES[name])
    pkg = package_of(name)
    ins = instructions(dockerfile)
    # The base is a build argument whose default is the official image (.ci/deploy builds FROM its own).
    assert ins[:2] == [("ARG", "BASE_IMAGE=python:3.11-slim"), ("FROM", "${BASE_IMAGE}")], ins[:2]
    copied, copied_at = set(), 0
    for i, (keyword, args) in enumerate(ins):
        if keyword in ("COPY", "ADD"):
            parts = [p for p in shlex.split(args) if not p.startswith("--")]
            copied.update(p.rstrip("/") for p in parts[:-1])
            copied_at = i
    # What `pip install ".[all]"` builds from (every package: one distribution holds them all), and no more.
    assert copied == {"requirements.txt", "pyproject.toml", "README.md", *TOP_LEVEL}, copied
    installs = [i for i, (keyword, args) in enumerate(ins)
                if keyword == "RUN" and shlex.split(args)[:4] == ["pip", "install", "--no-cache-dir", ".[all]"]]
    assert installs and installs[-1] > copied_at, "the package must be installed after its sources are copied"
    assert SCRIPTS[cmd_of(dockerfile)[0]] == f"fl_services.{pkg}.main:main"
    users = [args for keyword, args in ins if keyword == "USER"]
    assert users and users[-1] not in ("root", "0"), "containers must not run as root"
    # The USER switch happens before CMD, so the service itself runs unprivileged.
    keywords = [k for k, _ in ins]
    assert max(i for i, k in enumerate(keywords) if k == "USER") < keywords.index("CMD")


@pytest.mark.parametrize("pkg", sorted(SETTINGS))
def test_dockerfile_installs_cpu_torch_before_requirements(pkg):
    dockerfile = ROOT / "docker" / f"Dockerfile.{pkg}"
    runs = [args for keyword, args in instructions(dockerfile) if keyword == "RUN"]
    torch_at = next(i for i, r in enumerate(runs) if re.search(r"\btorch==", r))
    torch_run = shlex.split(runs[torch_at])
    assert TORCH_PIN in torch_run
    # The index is a build argument (.ci/deploy serves the wheel on its loopback); its default, PyTorch's.
    assert torch_run[torch_run.index("--index-url") + 1] == "${TORCH_INDEX_URL}"
    assert build_args(dockerfile)["TORCH_INDEX_URL"] == CPU_INDEX
    assert "--no-cache-dir" in torch_run
    reqs_at = next(i for i, r in enumerate(runs) if "-r requirements.txt" in r)
    assert torch_at < reqs_at, "torch must be installed from the CPU index before requirements.txt"
    # requirements.txt pins the same version, so pip keeps the CPU build instead of fetching CUDA.
    assert TORCH_PIN in (ROOT / "requirements.txt").read_text().split()


@pytest.mark.parametrize("pkg", ["cloud", "edge"])
def test_dockerfile_healthcheck_probes_health(pkg):
    ins = instructions(ROOT / "docker" / f"Dockerfile.{pkg}")
    checks = [args for keyword, args in ins if keyword == "HEALTHCHECK"]
    assert checks, f"Dockerfile.{pkg} has no HEALTHCHECK"
    command = checks[-1].split(" CMD ", 1)[1]
    argv = shlex.split(command)
    assert argv[:2] == ["python", "-c"]
    compile(argv[2], f"<Dockerfile.{pkg} healthcheck>", "exec")
    assert "urllib" in argv[2] and "/health" in argv[2] and f"{SETTINGS[pkg][0]}PORT" in argv[2]


def test_dockerignore_keeps_local_state_out_but_not_the_sources():
    patterns = {line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
                if line.strip() and not line.startswith("#")}
    assert {".venv", ".git", "secrets", "certs", "results"} <= patterns
    assert any("__pycache__" in p for p in patterns)
    for needed in ("requirements.txt", "pyproject.toml", "README.md", *TOP_LEVEL):
        assert needed not in patterns and f"{needed}/" not in patterns


def named_volume_targets(service: dict) -> list[str]:
    """Container paths on which the service mounts a named volume (bind mounts keep the host's owner)."""
    targets = []
    for volume in service.get("volumes") or []:
        if isinstance(volume, str):
            source, target = volume.split(":")[:2]
        else:
            source, target = volume.get("source", ""), volume["target"]
        if source and not source.startswith((".", "/", "~")):
            targets.append(target.rstrip("/") or "/")
    return targets


def prepared_directories(dockerfile: Path) -> tuple[str, set[str], dict[str, tuple[str, bool]]]:
    """The user the image runs as (its last USER), and what its RUN steps before that USER do:
    the directories they `mkdir`, and per path the user a `chown` gives it to (and whether recursively)."""
    ins = instructions(dockerfile)
    last_user = max(i for i, (keyword, _) in enumerate(ins) if keyword == "USER")
    user = ins[last_user][1].split(":")[0]
    made: set[str] = set()
    owned: dict[str, tuple[str, bool]] = {}
    for keyword, args in ins[:last_user]:
        if keyword != "RUN":
            continue
        for command in re.split(r"&&|\|\||;", args):
            argv = shlex.split(command)
            if not argv:
                continue
            options = [a for a in argv[1:] if a.startswith("-")]
            operands = [a.rstrip("/") or "/" for a in argv[1:] if not a.startswith("-")]
            if argv[0] == "mkdir":
                made.update(operands)
            elif argv[0] == "chown" and operands:
                owner = operands[0].split(":")[0]
                recursive = any(o in ("-R", "--recursive") for o in options)
                owned.update({path: (owner, recursive) for path in operands[1:]})
    return user, made, owned


@pytest.mark.parametrize("name", [n for n in BUILT if named_volume_targets(SERVICES[n])])
def test_mounted_volumes_are_created_and_owned_by_the_service_user(name):
    """A named volume starts as a copy of the image's directory, owner included: one the image lacks, or
    that root owns, leaves the unprivileged service unable to write its state (PermissionError)."""
    service = SERVICES[name]
    user, made, owned = prepared_directories(dockerfile_path(service))
    user = str(service.get("user", user)).split(":")[0]
    for target in named_volume_targets(service):
        assert target in made, f"{name}: {dockerfile_path(service).name} does not mkdir {target}, its volume"
        owner = owned.get(target) or next((owned[p] for p in owned if owned[p][1] and target.startswith(f"{p}/")),
                                          None)
        assert owner is not None and owner[0] == user, (
            f"{name}: {dockerfile_path(service).name} does not chown {target} to {user}, the user it runs as")


@pytest.mark.parametrize("name", services_running("edge"))
def test_edges_keep_their_state_on_their_volume(name):
    state_dir = environment(SERVICES[name])["FL_EDGE_STATE_DIR"]
    assert state_dir in named_volume_targets(SERVICES[name])


# --- environment <-> settings classes --------------------------------------------------------

@pytest.mark.parametrize("name", BUILT)
def test_environment_variables_are_settings_fields(name):
    assert_settings_fields(name, SERVICES[name])


def assert_settings_fields(name: str, service: dict) -> None:
    """Every variable `service` sets is a field of the settings class of the package it runs."""
    pkg = package_of(name)
    prefix, settings_cls = SETTINGS[pkg]
    env = environment(service)
    assert env, f"{name} sets no environment"
    for key in env:
        assert key.startswith("FL_"), f"{name}: {key} is not read by any settings class"
        owner = next((p for p in PREFIXES if key.startswith(p)), None)
        assert owner is not None, f"{name}: {key} has no known FL_<SERVICE>_ prefix"
        # The prefix must be the one of the package this image runs: FL_EDGE_* on a cloud is ignored.
        assert owner == prefix, f"{name} runs {pkg} but sets {key}"
        field = key[len(prefix):].lower()
        if field not in settings_cls.model_fields:  # <field>_FILE: the field, from a file
            field = field.removesuffix("_file")
        assert field in settings_cls.model_fields, f"{name}: {key} is not a field of {settings_cls.__name__}"


@pytest.mark.parametrize("name", BUILT)
def test_services_bind_all_interfaces(name):
    pkg = package_of(name)
    prefix, settings_cls = SETTINGS[pkg]
    if "host" in settings_cls.model_fields:
        assert environment(SERVICES[name]).get(f"{prefix}HOST") == "0.0.0.0"


RUN_SECRETS = "/run/secrets/"


def secret_values() -> dict[str, str]:
    """What each Docker secret of both files holds in these tests (a file per secret, as Docker mounts them
    under /run/secrets): a client container's tokens are issued from the edges' client secret for the
    clients it hosts, as `fedctl issue-token --out` writes them."""
    values = {name: f"{name}-{os.urandom(8).hex()}" for name in TLS_COMPOSE.get("secrets") or {}}
    for service in TLS_COMPOSE["services"].values():
        env = environment(service)
        tokens = env.get("FL_CLIENT_CLIENT_TOKENS_FILE", "")
        if tokens.startswith(RUN_SECRETS):
            issued = issue_device_tokens(values["client_token"], parse_ids(env["FL_CLIENT_CLIENTS"]))
            values[tokens.removeprefix(RUN_SECRETS)] = tokens_file_text(issued)
    return values


SECRET_VALUES = secret_values()


def settings_from_compose(monkeypatch, name: str, secrets_dir: Path | None = None,
                          services: dict[str, dict] = SERVICES):
    """The service's settings from its compose environment in `services` (the base file's, or the TLS
    variant's); its secrets from files in `secrets_dir`."""
    prefix, settings_cls = SETTINGS[package_of(name)]
    env = {key: interpolate(value) for key, value in environment(services[name]).items()}
    for key, value in env.items():
        if key.endswith("_FILE") and value.startswith(RUN_SECRETS):
            assert secrets_dir is not None, f"{name}: {key} needs the secrets"
            secret = value.removeprefix(RUN_SECRETS)
            assert secret in services[name].get("secrets", []), f"{name} reads secret {secret} it is not given"
            (secrets_dir / secret).write_text(SECRET_VALUES[secret] + "\n")
            value = str(secrets_dir / secret)
        monkeypatch.setenv(key, value)
    return settings_cls(), env, prefix


def setting_of(settings, prefix: str, key: str):
    return getattr(settings, key[len(prefix):].lower().removesuffix("_file"))


@pytest.mark.parametrize("name", BUILT)
def test_settings_round_trip(clean_env, tmp_path, name):
    settings, env, prefix = settings_from_compose(clean_env, name, tmp_path)
    for key, raw in env.items():
        value = setting_of(settings, prefix, key)
        if key.endswith("_FILE"):
            raw = SECRET_VALUES[raw.removeprefix(RUN_SECRETS)]
        assert value == type(value)(raw), f"{key}={raw!r} became {value!r}"


def test_cloud_settings_from_compose(clean_env, tmp_path):
    cloud, _, _ = settings_from_compose(clean_env, "cloud", tmp_path)
    assert cloud.redis_url == "redis://redis:6379/0"
    assert (cloud.host, cloud.port) == ("0.0.0.0", 8000)
    assert cloud.admin_token == SECRET_VALUES["admin_token"]
    assert cloud.edge_token == SECRET_VALUES["edge_token"]
    assert urlsplit(cloud.redis_url).hostname in SERVICES


def test_edges_reach_the_cloud_with_its_token(clean_env, tmp_path):
    cloud_env = environment(SERVICES["cloud"])
    edges = services_running("edge")
    ids = []
    for name in edges:
        edge_env = environment(SERVICES[name])
        assert edge_env["FL_EDGE_EDGE_TOKEN_FILE"] == cloud_env["FL_CLOUD_EDGE_TOKEN_FILE"]
        url = urlsplit(interpolate(edge_env["FL_EDGE_CLOUD_URL"]))
        assert (url.hostname, url.port) == ("cloud", int(cloud_env["FL_CLOUD_PORT"]))
        public = urlsplit(edge_env["FL_EDGE_PUBLIC_URL"])
        assert (public.hostname, public.port) == (name, int(edge_env["FL_EDGE_PORT"]))
        ids.append(int(edge_env["FL_EDGE_EDGE_ID"]))
    assert sorted(ids) == list(range(len(edges))), "edge ids must be 0..L-1"
    edge1, _, _ = settings_from_compose(clean_env, "edge1", tmp_path)
    assert (edge1.edge_id, edge1.cloud_url, edge1.client_token) == (1, "http://cloud:8000",
                                                                     SECRET_VALUES["client_token"])


def test_clients_cover_each_id_once_on_the_edge_that_serves_it(clean_env, tmp_path):
    """Client k is served by edge k mod L (fedctl/launch.py, RunConfig.clients_of_edge)."""
    edges = {name: environment(SERVICES[name]) for name in services_running("edge")}
    num_edges = len(edges)
    seen: list[int] = []
    for name in services_running("client"):
        env = environment(SERVICES[name])
        url = urlsplit(env["FL_CLIENT_EDGE_URL"])
        assert url.hostname in edges, f"{name} dials unknown edge {url.hostname}"
        edge_env = edges[url.hostname]
        assert url.port == int(edge_env["FL_EDGE_PORT"])
        assert env["FL_CLIENT_CLIENT_TOKEN_FILE"] == edge_env["FL_EDGE_CLIENT_TOKEN_FILE"]
        assert url.hostname in SERVICES[name]["depends_on"]
        edge_id = int(edge_env["FL_EDGE_EDGE_ID"])
        ids = parse_ids(env["FL_CLIENT_CLIENTS"])
        assert all(k % num_edges == edge_id for k in ids), f"{name}: {ids} are not all served by edge {edge_id}"
        seen += ids
        # Each client process keeps its state in its own named volume.
        state = env["FL_CLIENT_STATE_DIR"]
        assert any(isinstance(v, str) and v.split(":")[1] == state for v in SERVICES[name].get("volumes") or [])
    assert sorted(seen) == list(range(len(seen))), f"logical client ids overlap or have gaps: {sorted(seen)}"
    client0, _, _ = settings_from_compose(clean_env, services_running("client")[0], tmp_path)
    assert str(client0.state_dir) == "/state" and client0.torch_threads == 1


def test_interpolate_defaults():
    assert interpolate("${FL_ADMIN_TOKEN:-change-me-admin}") == "change-me-admin"
    assert interpolate("a${X-b}c${Y}") == "abc"


def test_the_documented_compose_run_config_fits_the_compose_topology():
    """docker/fedavg-two-edges.json must match the two edges and ten clients the compose file starts."""
    import json

    from fl_services.shared.core.config import RunConfig

    config = RunConfig.model_validate(json.loads((ROOT / "docker" / "fedavg-two-edges.json").read_text()))
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    edges = [s for s in compose["services"] if s.startswith("edge")]
    assert config.topology.num_edges == len(edges)
    hosted = sorted(int(i) for name, s in compose["services"].items() if name.startswith("client")
                    for i in s["environment"]["FL_CLIENT_CLIENTS"].split(","))
    assert hosted == list(range(config.data.num_clients))


def test_built_services_run_under_an_init():
    """SIGTERM reaches the Python process (a PID 1 without a handler ignores it) and stops it at once."""
    assert all(SERVICES[name].get("init") is True for name in BUILT), {n: SERVICES[n].get("init") for n in BUILT}


# --- the TLS variant: docker/docker-compose.tls.yml merged onto docker-compose.yml -------------

TLS_SERVICES: dict[str, dict] = TLS_COMPOSE["services"]


@pytest.fixture(scope="module")
def certificate_files(tmp_path_factory) -> set[str]:
    """The files `fedctl certs` writes for this compose topology (two edges, two client processes)."""
    directory = tmp_path_factory.mktemp("certs")
    write_deployment(directory, edges=len(services_running("edge")), clients=len(services_running("client")))
    return {p.name for p in directory.iterdir()}


# The Compose Specification's JSON schema, schema/compose-spec.json of github.com/compose-spec/compose-spec
# (Apache-2.0) at commit 170098ba07d9 (2026-06-23): what `docker compose config` checks a file against.
COMPOSE_SCHEMA = json.loads((ROOT / "tests" / "schemas" / "compose-spec.json").read_text())


@pytest.mark.parametrize("variant", ["base", "tls"])
def test_the_compose_files_are_valid_against_the_compose_specification(variant):
    """The base file, and the TLS variant as Compose merges it onto the base (its `!reset` and `!override`
    resolved: the schema describes a file's data, not its tags)."""
    compose = {"base": COMPOSE, "tls": TLS_COMPOSE}[variant]
    errors = sorted(jsonschema.Draft7Validator(COMPOSE_SCHEMA).iter_errors(compose), key=str)
    assert not errors, "\n".join(f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in errors)


def test_the_tls_variant_overrides_services_of_the_base_file_only():
    assert set(TLS_OVERRIDE["services"]) <= set(SERVICES)
    assert set(TLS_OVERRIDE["services"]) >= {"redis", *BUILT}, "every hop: each service is changed"


@pytest.mark.parametrize("name", BUILT)
def test_tls_variant_variables_are_settings_fields_and_name_mounted_certificates(clean_env, name,
                                                                                 certificate_files, tmp_path):
    assert_settings_fields(name, TLS_SERVICES[name])
    settings_from_compose(clean_env, name, tmp_path, TLS_SERVICES)  # the validators accept them
    mounts = {str(v).split(":")[1]: str(v).split(":")[0] for v in TLS_SERVICES[name].get("volumes") or []}
    files = {key: Path(value) for key, value in environment(TLS_SERVICES[name]).items()
             if key.endswith("_FILE") and not value.startswith(RUN_SECRETS)}  # secrets: see the test below
    assert files, f"{name} is given no certificate"
    for key, path in files.items():
        assert mounts.get(str(path.parent)) == "./certs", f"{name}: {key}={path} is not in the mounted ./certs"
        assert path.name in certificate_files, f"{name}: {key}={path}: `fedctl certs` writes no {path.name}"


@pytest.mark.parametrize("name", BUILT)
def test_tls_variant_uses_https_and_mutual_tls_on_every_hop(clean_env, name, tmp_path):
    settings, _, _ = settings_from_compose(clean_env, name, tmp_path, TLS_SERVICES)
    pkg = package_of(name)
    if pkg in ("cloud", "edge"):  # serves HTTPS and requires a client certificate
        assert settings.tls_cert_file and settings.tls_key_file and settings.tls_client_ca_file
        assert settings.tls_options()["ssl_cert_reqs"] == ssl.CERT_REQUIRED
        for code in healthcheck_snippets(TLS_SERVICES[name]):  # the probe presents the service's own certificate
            compile(code, f"<{name} healthcheck>", "exec")
            assert f"https://127.0.0.1:{settings.port}/health" in code
            assert f"load_cert_chain('{settings.tls_cert_file}', '{settings.tls_key_file}')" in code
    if pkg == "cloud":
        assert settings.redis_url.startswith("rediss://") and settings.redis_cert_file and settings.redis_ca_file
    if pkg == "edge":
        assert settings.cloud_url.startswith("https://") and settings.cloud_cert_file and settings.cloud_ca_file
        assert str(settings.public_url).startswith("https://")
    if pkg == "client":
        assert settings.edge_url.startswith("https://") and settings.edge_cert_file and settings.edge_ca_file


def test_tls_variant_client_containers_hold_a_token_per_client_and_not_the_client_secret(clean_env, tmp_path):
    """Each client container is given its own tokens secret, one token per logical client it hosts, which its
    edge accepts for that client only; the edges' client secret, with which any client could be played, is
    neither mounted in it nor named by its settings."""
    given = []
    for name in services_running("client"):
        service = TLS_SERVICES[name]
        assert "client_token" not in service.get("secrets", []), f"{name} is given the edges' client secret"
        assert "FL_CLIENT_CLIENT_TOKEN_FILE" not in environment(service)
        settings, env, _ = settings_from_compose(clean_env, name, tmp_path, TLS_SERVICES)
        assert settings.client_token != SECRET_VALUES["client_token"]
        given.append(env["FL_CLIENT_CLIENT_TOKENS_FILE"])
        edge = urlsplit(settings.edge_url).hostname
        edge_settings, _, _ = settings_from_compose(clean_env, edge, tmp_path, TLS_SERVICES)
        hosted = settings.hosted_ids()  # raises if a hosted client has no token
        for k in hosted:
            assert device_token_id(edge_settings.client_token, settings.token_of(k), k) is not None
            assert all(device_token_id(edge_settings.client_token, settings.token_of(k), other) is None
                       for other in hosted if other != k)
    assert len(set(given)) == len(given), f"client containers share a tokens secret: {given}"


def substituted(script: str, paths: dict[str, Path]) -> str:
    """`script` with each container path in `paths` replaced by this machine's (in one pass: the
    replacements may contain the others, e.g. /tmp/)."""
    pattern = re.compile("|".join(map(re.escape, paths)))
    return pattern.sub(lambda m: f"{paths[m.group(0)]}/", script)


@pytest.fixture()
def redis_of_the_tls_variant(clean_env, tmp_path):
    """Redis started by the TLS variant's own command, with redis-server of this machine: /run/secrets, /certs
    and /tmp are directories of this test, and the image's entrypoint and `chown redis` stubs (the
    entrypoint drops to the redis user; here everything runs as this test's user)."""
    command = TLS_SERVICES["redis"]["command"]
    assert command[:2] == ["sh", "-c"], command
    paths = {"/run/secrets/": tmp_path / "secrets", "/certs/": tmp_path / "certs", "/tmp/": tmp_path / "tmp"}
    for directory in (*paths.values(), tmp_path / "bin", tmp_path / "data"):
        directory.mkdir()
    write_deployment(paths["/certs/"], edges=0, clients=0)
    (paths["/run/secrets/"] / "redis_password").write_text(SECRET_VALUES["redis_password"] + "\n")
    for stub, body in {"docker-entrypoint.sh": 'exec "$@"', "chown": "exit 0"}.items():
        (tmp_path / "bin" / stub).write_text(f"#!/bin/sh\n{body}\n")
        (tmp_path / "bin" / stub).chmod(0o755)
    port = free_port()
    script = substituted(interpolate(command[2]), paths).replace("--tls-port 6379", f"--tls-port {port}")
    env = {"PATH": f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}"}
    process = subprocess.Popen(["sh", "-c", script], cwd=tmp_path / "data", env=env, stdout=subprocess.DEVNULL)
    try:
        yield process, port, paths, env
    finally:
        process.terminate()
        process.wait(timeout=30)


def test_tls_variant_redis_starts_from_its_command_with_the_password_secret_the_cloud_reads(
        clean_env, tmp_path, redis_of_the_tls_variant):
    """No password in the compose files: Redis and the cloud read the same Docker secret. Redis' start-up script
    runs here (a shell script in YAML, `$$` escapes included), and the cloud's settings reach it over TLS."""
    process, port, paths, env = redis_of_the_tls_variant
    script = TLS_SERVICES["redis"]["command"][2]
    args = shlex.split(interpolate(script).split("redis-server", 1)[1])
    assert args[args.index("--port") + 1] == "0"  # no plain-text port
    assert args[args.index("--tls-port") + 1] == "6379"
    assert args[args.index("--appendfsync") + 1] == "always"  # what the base file's Redis promises, kept
    assert "redis_password" in TLS_SERVICES["redis"]["secrets"]
    (tmp_path / "cloud-secrets").mkdir()
    cloud, _, _ = settings_from_compose(clean_env, "cloud", tmp_path / "cloud-secrets", TLS_SERVICES)
    assert urlsplit(cloud.redis_url).password is None and cloud.redis_password == SECRET_VALUES["redis_password"]
    options = {key: substituted(value, paths) for key, value in cloud.redis_options().items() if key != "password"}
    url = f"rediss://127.0.0.1:{port}/0"
    deadline = time.monotonic() + 30
    while True:
        assert process.poll() is None, "Redis exited"
        try:
            assert redis.Redis.from_url(url, password=cloud.redis_password, socket_timeout=5, **options).ping()
            break
        except redis.ConnectionError:
            assert time.monotonic() < deadline, "Redis did not come up"
            time.sleep(0.2)
    with pytest.raises(redis.AuthenticationError):  # at once (retry=None: not retried with backoff)
        redis.Redis.from_url(url, password="wrong", socket_timeout=5, retry=None, **options).ping()
    # The password sits in a file only its owner can read, not on Redis' command line (which `ps` shows).
    assert (paths["/tmp/"] / "redis-auth.conf").stat().st_mode & 0o077 == 0
    assert cloud.redis_password not in Path(f"/proc/{process.pid}/cmdline").read_text()
    # The health check, run as Docker runs it (a shell), with the redis-cli of this machine.
    test = TLS_SERVICES["redis"]["healthcheck"]["test"]
    assert test[0] == "CMD-SHELL"
    check = substituted(interpolate(test[1]), paths).replace("redis-cli ", f"redis-cli -p {port} ")
    assert subprocess.run(["sh", "-c", check], env=env, timeout=30).returncode == 0
    (paths["/run/secrets/"] / "redis_password").write_text("wrong\n")
    assert subprocess.run(["sh", "-c", check], env=env, timeout=30).returncode != 0


# --- exposure: ports, secrets, networks (docs/explanation-security-model.md) ------------------

def published(service: dict) -> list[dict]:
    """The service's published ports in the long syntax's terms (host_ip, published, target)."""
    out = []
    for port in service.get("ports") or []:
        if isinstance(port, dict):
            out.append(port)
            continue
        parts = str(port).split(":")
        host_ip = parts[0] if len(parts) == 3 else ""
        out.append({"host_ip": host_ip, "published": parts[-2] if len(parts) > 1 else "", "target": parts[-1]})
    return out


def test_published_ports_listen_on_the_hosts_loopback_only():
    """A published port without an address listens on every interface of the host: the cloud's admin API,
    the edges and the monitoring would be reachable from anywhere the host is."""
    ports = {name: published(service) for name, service in SERVICES.items() if service.get("ports")}
    assert {"cloud", "edge0", "edge1"} <= set(ports)
    for name, entries in ports.items():
        for entry in entries:
            assert entry["host_ip"] == "127.0.0.1", f"{name} publishes {entry} beyond loopback"


@pytest.mark.parametrize("variant", ["base", "tls"])
def test_no_token_or_password_has_a_default_or_sits_in_the_environment(variant):
    compose = {"base": COMPOSE, "tls": TLS_COMPOSE}[variant]
    secret_like = re.compile(r"TOKEN|PASSWORD|SECRET", re.IGNORECASE)
    for name, service in compose["services"].items():
        for key, value in environment(service).items():
            if key.endswith("REDIS_URL"):
                assert urlsplit(interpolate(value)).password is None, f"{name}: {key} holds a password"
            if not secret_like.search(key):
                continue
            # Only a file's name: the value itself is a Docker secret, mounted under /run/secrets.
            assert key.endswith("_FILE") and value.startswith(RUN_SECRETS), f"{name}: {key}={value!r}"
            assert value.removeprefix(RUN_SECRETS) in service.get("secrets", []), f"{name}: {key} is not given"
    for secret, spec in (compose.get("secrets") or {}).items():
        assert set(spec) == {"file"} and "${" in spec["file"] and spec["file"].endswith(f"/{secret}"), spec
    for path in (COMPOSE_FILE, TLS_FILE):
        assert "change-me" not in path.read_text() and ":-change" not in path.read_text()


def networks_of(name: str) -> set[str]:
    networks = SERVICES[name].get("networks")
    assert networks, f"{name} names no network: it would join the default one, which every service shares"
    return set(networks)


def test_redis_shares_no_network_with_the_clients_and_each_hop_has_one():
    for name in SERVICES:
        assert networks_of(name) <= set(COMPOSE.get("networks") or {}), name
    redis = networks_of("redis")
    for name in services_running("client"):
        assert not redis & networks_of(name), f"{name} can reach Redis"
    for name in services_running("edge"):
        assert not redis & networks_of(name), f"{name} can reach Redis"
        assert networks_of(name) & networks_of("cloud"), f"{name} cannot reach the cloud"
    assert redis & networks_of("cloud")
    for client in services_running("client"):
        edge = urlsplit(environment(SERVICES[client])["FL_CLIENT_EDGE_URL"]).hostname
        assert networks_of(edge) & networks_of(client), f"{client} cannot reach {edge}"
    assert not networks_of("cloud") & set().union(*(networks_of(n) for n in services_running("client")))
