"""fedctl as an operator meets it: a mistake is one error line, naming the file (and line) or the variable to
set, and exit status 1, not a traceback. The config mistakes run fedctl's entry point in this process (what
the console script runs, without a fresh interpreter importing torch each time); the unreachable cloud runs it
as a process, as an operator does."""
from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _fedctl(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200", **(env or {})}
    return subprocess.run([sys.executable, "-m", "fl_services.fedctl", *args], capture_output=True, text=True, env=env,
                          timeout=timeout, cwd=ROOT)


def _fedctl_here(capsys, monkeypatch, *args: str) -> subprocess.CompletedProcess:
    """`fedctl ARGS` through the console script's entry point in this process: its exit status and output."""
    from fl_services.fedctl.__main__ import main

    monkeypatch.setenv("COLUMNS", "200")
    monkeypatch.setattr(sys, "argv", ["fedctl", *args])
    # What main() sets for its process (the retry logger's level, any root handler writing to this test's captured
    # stderr) is put back: the next tests share this process.
    retry, root = logging.getLogger("fl_services.shared.wire.retry"), logging.getLogger()
    levels, handlers = (retry.level, root.level), root.handlers[:]
    monkeypatch.setattr(sys, "excepthook", sys.excepthook)
    monkeypatch.setattr(threading, "excepthook", threading.excepthook)
    capsys.readouterr()
    try:
        main()
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    finally:
        retry.setLevel(levels[0])
        root.setLevel(levels[1])
        root.handlers[:] = handlers
    out = capsys.readouterr()
    return subprocess.CompletedProcess(["fedctl", *args], code, out.out, out.err)


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def one_error_line(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 1, (done.stdout, done.stderr)
    out = done.stdout + done.stderr
    assert "Traceback" not in out
    lines = out.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), out
    return lines[0]


@pytest.mark.parametrize(("name", "text", "expected"), [
    ("bad.json", '{"rounds": 0}', ["bad.json: rounds: Input should be greater than or equal to 1"]),
    ("bad.json", "[1, 2]", ["bad.json: a run config is a JSON object of settings, not a list"]),
    ("bad.json", '"fedavg"', ["bad.json: a run config is a JSON object of settings, not a str"]),
    ("bad.json", '{"rounds": 3,\n "seed": }', ["bad.json:2:10: not valid JSON: Expecting value"]),
    ("bad.toml", 'rounds = 3\nseed = \n', ["bad.toml: not valid TOML", "line 2"]),
    ("bad.yaml", "rounds: 3\nseed: [1,\n", ["bad.yaml:", "not valid YAML"]),
    ("ok.yaml", "rounds: 0\n", ["ok.yaml: rounds: Input should be greater than or equal to 1"]),
    ("bad.json", '{"algorithm": "scaffold", "topology": {"num_edges": 2, "buffer_size": 1}, '
                 '"data": {"num_clients": 4}}',
     ["bad.json: topology.buffer_size: scaffold is synchronous: topology.buffer_size must equal num_edges (2), "
      "got 1"]),
    ("missing.json", None, ["missing.json: cannot read it: No such file or directory"]),
], ids=["invalid-field", "a-list", "a-string", "json-syntax", "toml-syntax", "yaml-syntax", "yaml-field",
        "algorithm-refuses", "missing-file"])
def test_an_invalid_config_is_one_error_line_naming_the_file(tmp_path, capsys, monkeypatch, name, text, expected):
    bad = tmp_path / name
    if text is not None:
        bad.write_text(text)
    line = one_error_line(_fedctl_here(capsys, monkeypatch, "create", str(bad), "--cloud",
                                       f"http://127.0.0.1:{_closed_port()}"))
    assert all(fragment in line for fragment in expected), line


def test_yaml_without_pyyaml_is_refused_clearly(tmp_path, capsys, monkeypatch):
    config = tmp_path / "run.yaml"
    config.write_text("rounds: 2\n")
    monkeypatch.setitem(sys.modules, "yaml", None)  # what a venv without pyyaml meets: `import yaml` fails
    line = one_error_line(_fedctl_here(capsys, monkeypatch, "create", str(config), "--cloud",
                                       f"http://127.0.0.1:{_closed_port()}"))
    assert "run.yaml: reading YAML needs the pyyaml package (pip install pyyaml)" in line, line


def test_an_unreachable_cloud_is_one_error_line():
    port = _closed_port()
    line = one_error_line(_fedctl("runs", "--cloud", f"http://127.0.0.1:{port}"))
    assert f"cannot reach the cloud at http://127.0.0.1:{port}" in line and "FL_CLOUD_URL" in line, line


def test_a_yaml_exponent_is_a_number_as_in_json_and_toml(tmp_path):
    """PyYAML reads 1e-3 as a string (YAML 1.1), which a number field refuses: fedctl reads it as YAML 1.2 does."""
    from fl_services.fedctl.configs import load_config

    config = tmp_path / "run.yaml"
    config.write_text("local:\n  lr: 1e-3\nname: 1e3x\n")
    loaded = load_config(config)
    assert (loaded.local.lr, loaded.name) == (0.001, "1e3x")
