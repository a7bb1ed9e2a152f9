"""Static checks of docker/docker-compose.devices.yml, the federation of devices merged onto docker-compose.yml
(its run, on a real engine, is the deploy tier's `devices` variant: .ci/deploy)."""
from __future__ import annotations

import json
import re
from pathlib import Path
from urllib.parse import urlsplit

import jsonschema
import pytest
import yaml

from fl_services.client.config import ClientSettings, parse_ids
from fl_services.shared.core.config import RunConfig
from fl_services.shared.core.data.specs import parse_source
from fl_services.shared.wire.protocol import issue_device_tokens
from tests.test_compose import (
    COMPOSE,
    COMPOSE_SCHEMA,
    ROOT,
    RUN_SECRETS,
    SERVICES,
    assert_settings_fields,
    environment,
    interpolate,
    merge,
    services_running,
)

DEVICES_FILE = ROOT / "docker" / "docker-compose.devices.yml"
OVERRIDE = yaml.safe_load(DEVICES_FILE.read_text())
MERGED = merge(COMPOSE, OVERRIDE)
DEVICES = sorted(name for name in OVERRIDE["services"] if name not in SERVICES)
RUN = RunConfig.model_validate(json.loads((ROOT / "docker" / "fedavg-devices.json").read_text()))


def starts_by_default(service: dict) -> bool:
    """`docker compose up` without a --profile starts only the services that name none."""
    return not service.get("profiles")


def test_the_merged_file_is_valid_against_the_compose_specification():
    errors = sorted(jsonschema.Draft7Validator(COMPOSE_SCHEMA).iter_errors(MERGED), key=str)
    assert not errors, "\n".join(f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in errors)


def test_it_adds_devices_and_names_the_sites_and_leaves_the_simulated_clients_to_a_profile():
    assert len(DEVICES) == 4
    changed = set(OVERRIDE["services"]) - set(DEVICES)
    assert changed == {*services_running("edge"), *services_running("client")}
    started = {name for name, service in MERGED["services"].items() if starts_by_default(service)}
    assert started == {"redis", "cloud", *services_running("edge"), *DEVICES}
    names = [environment(MERGED["services"][edge])["FL_EDGE_NAME"] for edge in services_running("edge")]
    assert len(set(names)) == len(names) == 2
    # The base file alone still starts what it always did.
    assert all(starts_by_default(SERVICES[name]) for name in ("redis", "cloud", *services_running("client")))


@pytest.mark.parametrize("name", DEVICES)
def test_a_device_is_a_client_with_its_own_token_data_and_state(clean_env, tmp_path, name):
    service = MERGED["services"][name]
    assert service["build"]["dockerfile"] == "docker/Dockerfile.client" and service["init"] is True
    env = environment(service)
    assert_settings_fields("client0", service)  # the variables are fields of the client's settings
    # Its own token, issued for its id alone: never the edges' client secret.
    [device_id] = parse_ids(env["FL_CLIENT_CLIENTS"])
    secret = env["FL_CLIENT_CLIENT_TOKEN_FILE"].removeprefix(RUN_SECRETS)
    assert service["secrets"] == [secret] and secret != "client_token"
    assert MERGED["secrets"][secret]["file"] == f"${{FL_SECRETS_DIR:-./secrets}}/{secret}"
    # Its data: a directory of this host of its own, mounted read-only at /data, which its spec reads.
    assert f"${{FL_DEVICE_DATA_DIR:-./device-data}}/{name}:/data:ro" in service["volumes"]
    mounts = {target: (source, mode)
              for source, target, *mode in (interpolate(v).split(":") for v in service["volumes"])}
    assert mounts["/data"] == (f"./device-data/{name}", ["ro"])
    spec = parse_source(env["FL_CLIENT_DATA"])
    assert Path(str(spec.path)).is_relative_to("/data")
    # Its state on a named volume of its own.
    assert mounts[env["FL_CLIENT_STATE_DIR"]][0] == f"{name}-state" and f"{name}-state" in MERGED["volumes"]
    # It reaches its edge, and nothing else.
    edge = urlsplit(env["FL_CLIENT_EDGE_URL"]).hostname
    assert edge in services_running("edge") and edge in service["depends_on"] and service["networks"] == ["devices"]
    secret_file = tmp_path / secret
    secret_file.write_text(next(iter(issue_device_tokens("client-secret", [device_id]).values())) + "\n")
    for key, value in env.items():
        clean_env.setenv(key, str(secret_file) if key.endswith("_FILE") else interpolate(value))
    settings = ClientSettings()
    assert settings.data == env["FL_CLIENT_DATA"] and settings.client_token.startswith("fl1.")


def test_each_device_is_its_own():
    envs = [environment(MERGED["services"][name]) for name in DEVICES]
    for key in ("FL_CLIENT_CLIENTS", "FL_CLIENT_CLIENT_TOKEN_FILE"):
        assert len({env[key] for env in envs}) == len(DEVICES), key
    sites = {urlsplit(env["FL_CLIENT_EDGE_URL"]).hostname for env in envs}
    assert sites == set(services_running("edge"))  # devices at every site


def test_the_deploy_tier_gives_each_device_a_token_for_its_id_and_site_and_selects_them_all():
    assert RUN.selection is not None and RUN.selection.sites == "all"
    assert RUN.selection.min_devices == len(DEVICES)
    [listed] = re.findall(r'^DEVICES="([^"]*)"$', (ROOT / ".ci" / "deploy").read_text(), re.MULTILINE)
    expected = []
    for name in DEVICES:
        env = environment(MERGED["services"][name])
        site = environment(MERGED["services"][urlsplit(env["FL_CLIENT_EDGE_URL"]).hostname])["FL_EDGE_NAME"]
        letter = env["FL_CLIENT_CLIENT_TOKEN_FILE"].removeprefix(f"{RUN_SECRETS}device_").removesuffix("_token")
        assert name == f"device-{letter}"
        expected.append(f"{letter}:{env['FL_CLIENT_CLIENTS']}:{site}")
    assert listed.split() == expected
