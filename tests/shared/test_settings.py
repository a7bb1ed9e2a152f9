"""Secrets from files (`*_FILE`, as Docker secrets provide them), and servers that refuse to listen beyond
loopback with the built-in development tokens unless told otherwise."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from fl_services.client.config import ClientSettings
from fl_services.cloud.config import CloudSettings
from fl_services.edge.config import EdgeSettings

ROOT = Path(__file__).resolve().parents[2]


def test_a_setting_may_come_from_a_file(clean_env, tmp_path):
    (tmp_path / "admin").write_text("s3cret-admin\n")  # as `echo` or a Docker secret writes it
    (tmp_path / "client").write_text("s3cret-client")
    clean_env.setenv("FL_CLOUD_ADMIN_TOKEN_FILE", str(tmp_path / "admin"))
    clean_env.setenv("FL_EDGE_CLIENT_TOKEN_FILE", str(tmp_path / "client"))
    clean_env.setenv("FL_CLIENT_CLIENT_TOKEN_FILE", str(tmp_path / "client"))
    assert CloudSettings().admin_token == "s3cret-admin"
    assert EdgeSettings().client_token == ClientSettings().client_token == "s3cret-client"
    clean_env.setenv("FL_CLOUD_ADMIN_TOKEN", "from-the-variable")  # the variable itself wins
    assert CloudSettings().admin_token == "from-the-variable"


def test_an_unreadable_file_is_a_clear_error(clean_env, tmp_path):
    clean_env.setenv("FL_CLOUD_EDGE_TOKEN_FILE", str(tmp_path / "missing"))
    with pytest.raises(Exception, match="FL_CLOUD_EDGE_TOKEN_FILE=.*missing: cannot read it"):
        CloudSettings()


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.1.2.3", "cloud.example.org"])
def test_development_tokens_are_refused_beyond_loopback(clean_env, host):
    with pytest.raises(ValidationError, match="FL_CLOUD_ADMIN_TOKEN, FL_CLOUD_EDGE_TOKEN: a built-in development"):
        CloudSettings(host=host)
    with pytest.raises(ValidationError, match="FL_CLOUD_ADMIN_TOKEN: a built-in"):  # compose's old placeholders
        CloudSettings(host=host, admin_token="change-me-admin", edge_token="x" * 32)
    with pytest.raises(ValidationError, match="FL_EDGE_CLIENT_TOKEN: a built-in development"):
        EdgeSettings(host=host)
    # A secret, or the explicit opt-out, or loopback: accepted.
    assert CloudSettings(host=host, admin_token="a" * 32, edge_token="e" * 32).host == host
    assert CloudSettings(host=host, allow_default_tokens=True).admin_token == "dev-admin-token"
    assert EdgeSettings(host=host, client_token="c" * 32).host == host


@pytest.mark.parametrize(("settings", "fragment"), [
    ({"admin_tokens": {"alice": "t" * 20, "bob": "t" * 20}}, "must all differ"),
    ({"admin_tokens": {"alice": "dev-admin-token"}}, "must all differ"),
    ({"admin_tokens": {"alice": "dev-edge-token"}}, "must all differ"),  # every edge an administrator
    ({"edge_token": "dev-admin-token"}, "must all differ"),
    ({"admin_tokens": {"admin": "t" * 20}}, "is admin_token's name in the audit log"),
], ids=["two-names", "named-admin-token", "named-edge-token", "edge-is-admin", "named-admin"])
def test_each_token_names_one_caller(clean_env, settings, fragment):
    """The audit log names whose token acted: a token under two names was recorded as the first of them."""
    with pytest.raises(ValidationError, match=fragment):
        CloudSettings(**settings)
    assert CloudSettings(admin_tokens={"alice": "a" * 20, "bob": "b" * 20}).admin_name("b" * 20) == "bob"


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "::1", "127.0.0.2"])
def test_development_tokens_are_fine_on_loopback(clean_env, host):
    assert CloudSettings(host=host).admin_token == "dev-admin-token"
    assert EdgeSettings(host=host).client_token == "dev-client-token"


@pytest.mark.parametrize("service", ["cloud", "edge"])
def test_a_server_with_a_development_token_on_all_interfaces_does_not_start(service):
    """As an operator meets it: one line saying what is wrong and how to fix it, and a failed exit."""
    prefix = f"FL_{service.upper()}_"
    env = {"PATH": "/usr/bin:/bin", f"{prefix}HOST": "0.0.0.0", f"{prefix}PORT": "1"}
    done = subprocess.run([sys.executable, "-m", f"fl_services.{service}.main"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode != 0
    assert done.stderr.startswith("invalid settings: ") and len(done.stderr.splitlines()) == 1, done.stderr
    assert "development token" in done.stderr and f"{prefix}ALLOW_DEFAULT_TOKENS=true" in done.stderr
