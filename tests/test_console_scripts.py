"""Every console script as a user first meets it: `--help` prints the usage and the settings (environment
variables) it reads and exits 0, starting nothing; the services refuse an argument they do not take."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from fl_services.fedctl.redis_server import free_port

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]

# What each script's help must name: its usage line and settings it reads.
EXPECTED = {
    "fl-cloud": ["usage: fl-cloud", "FL_CLOUD_REDIS_URL", "FL_CLOUD_PORT", "FL_CLOUD_ADMIN_TOKEN",
                 "FL_CLOUD_<NAME>_FILE", "FL_CLOUD_CONFIG_FILE"],
    "fl-edge": ["usage: fl-edge", "FL_EDGE_CLOUD_URL", "FL_EDGE_PORT", "FL_EDGE_CLIENT_TOKEN", "FL_EDGE_<NAME>_FILE"],
    "fl-client": ["Usage: fl-client", "FL_CLIENT_EDGE_URL", "FL_CLIENT_CLIENTS", "FL_CLIENT_LONG_POLL_S",
                  "FL_CLIENT_SHARD_COUNT", "FL_CLIENT_<NAME>_FILE"],
    "fedctl": ["Usage: fedctl", "up", "down", "export", "FL_CLOUD_URL", "FL_ADMIN_TOKEN", "FL_CA_FILE"],
}


def script(name: str, *args: str, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess:
    """The console script `name` as its entry point runs it (module:function from pyproject.toml), from this
    checkout."""
    module, function = SCRIPTS[name].split(":")
    code = f"import sys; sys.argv[0] = {name!r}; from {module} import {function}; sys.exit({function}())"
    return subprocess.run([sys.executable, "-c", code, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200", **env})


def test_every_script_is_covered():
    assert set(EXPECTED) == set(SCRIPTS)


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_help_prints_the_usage_and_settings_and_starts_nothing(name):
    ports = {"FL_CLOUD_PORT": free_port(), "FL_EDGE_PORT": free_port()}
    # Were a service started, it would listen on these ports (and the cloud dial this Redis): it would not exit.
    env = {**{k: str(v) for k, v in ports.items()}, "FL_CLOUD_REDIS_URL": f"redis://127.0.0.1:{free_port()}/0",
           "FL_EDGE_CLOUD_URL": f"http://127.0.0.1:{free_port()}", "FL_CLIENT_EDGE_URL": f"http://127.0.0.1:{free_port()}"}
    done = script(name, "--help", env=env)
    assert done.returncode == 0, done.stderr
    for fragment in EXPECTED[name]:
        assert fragment in done.stdout, (fragment, done.stdout)
    assert "Traceback" not in done.stderr
    for port in ports.values():  # nothing listens there now (the script is gone, and never bound them)
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as a server binds a reserved port
            sock.bind(("127.0.0.1", port))


@pytest.mark.parametrize("name", ["fl-cloud", "fl-edge"])
def test_a_service_refuses_an_argument_it_does_not_take(name):
    done = script(name, "--port", "9000", env={})
    assert done.returncode == 2
    assert "takes no arguments ('--port 9000'): its settings come from the environment" in done.stderr


def test_fedctl_help_imports_neither_torch_nor_the_models():
    # What keeps `fedctl --help` under a second on a loaded machine (8.5 s before its imports were lazy): a
    # deterministic stand-in for a timing.
    code = ("import sys\nfrom fl_services.fedctl.__main__ import main\nsys.argv = ['fedctl', 'create', '--help']\n"
            "try:\n    main()\nexcept SystemExit:\n    pass\n"
            "print(sorted(m for m in ('torch', 'httpx', 'numpy', 'fl_services.shared.core.algorithms', "
            "'fl_services.fedctl.api') if m in sys.modules), file=sys.stderr)")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"})
    assert "data.client_holdout" in done.stdout  # create's epilog, made when shown
    assert done.stderr.strip().splitlines()[-1] == "[]", done.stderr
