"""fedctl as an operator meets it: a mistake is one error line and exit status 1, not a traceback."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _fedctl(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200", **(env or {})}
    return subprocess.run([sys.executable, "-m", "fl_services.fedctl", *args], capture_output=True, text=True, env=env,
                          timeout=timeout, cwd=ROOT)


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.parametrize(("text", "expected"), [
    ('{"rounds": 0}', ["error: ValidationError", "rounds"]),
    ("[1, 2]", ["error: ValueError", "a run config is a JSON object of settings, not a list"]),  # a traceback before
    ('"fedavg"', ["error: ValueError", "not a str"]),
], ids=["invalid-field", "a-list", "a-string"])
def test_an_invalid_config_is_one_error_line(tmp_path, text: str, expected: list[str]):
    bad = tmp_path / "bad.json"
    bad.write_text(text)
    done = _fedctl("create", str(bad), "--cloud", f"http://127.0.0.1:{_closed_port()}")
    assert done.returncode == 1
    out = done.stdout + done.stderr
    assert "Traceback" not in out
    assert all(fragment in out for fragment in expected), out


def test_an_unreachable_cloud_is_one_error_line():
    done = _fedctl("runs", "--cloud", f"http://127.0.0.1:{_closed_port()}")
    assert done.returncode == 1
    out = done.stdout + done.stderr
    assert "Traceback" not in out
    assert "error: ConnectError" in out
