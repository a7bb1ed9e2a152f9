"""`fedctl up` / `fedctl down` and `fedctl demo` as an operator runs them, as processes: a standing topology
that prints its URLs and tokens, answers fedctl and fl-client with one-line hints, exports a run, and leaves
no process behind after SIGTERM (to `up` or to `demo`) or `fedctl down` (also after `up` was killed)."""
from __future__ import annotations

import csv
import io
import json
import os
import signal
import stat
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from fl_services.fedctl.api import CloudAPI
from fl_services.fedctl.launch import LocalTopology
from fl_services.fedctl.warm import process_start_time
from fl_services.shared.core.reports import RunStatus

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}


def gone(pid: int) -> bool:
    """Whether process `pid` has ended (a zombie has: it only waits to be reaped)."""
    return process_start_time(pid) is None


def wait_gone(pids: list[int], timeout: float = 30) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not all(gone(p) for p in pids):
        time.sleep(0.1)
    return [p for p in pids if not gone(p)]


def fedctl(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fl_services.fedctl", *args], cwd=ROOT, capture_output=True, text=True,
                          env={**ENV, **(env or {})}, timeout=timeout)


@dataclass
class Standing:
    proc: subprocess.Popen
    directory: Path
    state: dict
    lines: list[str]

    @property
    def pids(self) -> list[int]:
        return [p["pid"] for p in self.state["processes"]]

    def tokens(self) -> dict[str, str]:
        pairs = (line.removeprefix("export ").split("=", 1) for line in
                 (self.directory / "tokens.env").read_text().splitlines() if line.startswith("export "))
        return dict(pairs)


def bring_up(directory: Path, *args: str) -> Standing:
    proc = subprocess.Popen([sys.executable, "-m", "fl_services.fedctl", "up", "--dir", str(directory),
                             "--cloud-port", "0", "--edge-port", "0", *args], cwd=ROOT, env=ENV, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    lines: list[str] = []
    ready = threading.Event()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            if line.startswith("stop:"):
                ready.set()

    threading.Thread(target=read, daemon=True).start()
    if not ready.wait(180):
        proc.kill()
        raise AssertionError("fedctl up never said it was up:\n" + "\n".join(lines))
    return Standing(proc, directory, json.loads((directory / "topology.json").read_text()), lines)


def clean_up(standing: Standing) -> None:
    """Whatever a failed test left running (the tests themselves stop it)."""
    if standing.proc.poll() is None:
        standing.proc.kill()
        standing.proc.wait()
    for pid in standing.pids:
        if not gone(pid):
            os.kill(pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def standing(tmp_path_factory) -> Standing:
    up = bring_up(tmp_path_factory.mktemp("up"), "--edges", "2", "--clients", "2")
    yield up
    clean_up(up)


def test_up_prints_every_url_and_how_to_get_tokens(standing: Standing):
    said = "\n".join(standing.lines)
    assert f"cloud {standing.state['cloud_url']}" in said and f"{standing.state['cloud_url']}/ui/" in said
    for l, url in enumerate(standing.state["edge_urls"]):
        assert f"edge {l} {url}" in said
    assert {p["name"] for p in standing.state["processes"]} == {"redis", "cloud", "edge0", "edge1", "client0.0",
                                                                "client1.0"}
    tokens = standing.tokens()
    assert set(tokens) == {"FL_ADMIN_TOKEN", "FL_EDGE_TOKEN", "FL_EDGE_CLIENT_TOKEN"}
    assert stat.S_IMODE((standing.directory / "tokens.env").stat().st_mode) == 0o600
    assert f"tokens: in {standing.directory / 'tokens.env'}" in said and "fedctl issue-token" in said
    listed = fedctl("runs", "--cloud", standing.state["cloud_url"], env=tokens)
    assert listed.returncode == 0, listed.stderr
    # The services log at info by default: the cloud's log says it started.
    assert " INFO " in (standing.directory / "cloud.log").read_text()


def test_a_wrong_admin_token_is_one_line_naming_the_variable(standing: Standing):
    done = fedctl("runs", "--cloud", standing.state["cloud_url"], "--token", "wrong")
    assert done.returncode == 1
    lines = (done.stdout + done.stderr).strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: GET /api/v1/runs: 401"), lines
    assert "set FL_ADMIN_TOKEN" in lines[0]


def test_fl_client_given_the_clouds_url_fails_fast(standing: Standing, tmp_path):
    code = "import sys; from fl_services.client.main import main; sys.argv[0] = 'fl-client'; main()"
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", code, "--edge", standing.state["cloud_url"], "--clients", "0",
                           "--state-dir", str(tmp_path)], cwd=ROOT, env=ENV, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2, done.stderr
    assert f"{standing.state['cloud_url']} is the cloud, not an edge" in done.stderr
    assert "FL_CLIENT_EDGE_URL (--edge) must name an edge" in done.stderr
    assert time.monotonic() - started < 60


def test_a_run_on_two_edges_without_buffer_size_trains_and_exports(standing: Standing, tmp_path):
    cloud, tokens = standing.state["cloud_url"], standing.tokens()
    config = tmp_path / "run.json"  # two edges, no buffer_size: FedAvg takes num_edges
    config.write_text(json.dumps({"name": "up", "rounds": 2, "model": {"name": "logreg"},
                                  "data": {"dataset": "digits", "num_clients": 2}, "topology": {"num_edges": 2}}))
    created = fedctl("create", str(config), "--cloud", cloud, env=tokens)
    assert created.returncode == 0, created.stderr
    run_id = created.stdout.strip()
    assert fedctl("control", run_id, "start", "--cloud", cloud, env=tokens).returncode == 0
    with CloudAPI(cloud, tokens["FL_ADMIN_TOKEN"]) as api:
        assert api.wait(run_id, timeout_s=300).status == RunStatus.finished
    results = fedctl("results", run_id, "--cloud", cloud, env=tokens)
    rows = [line.split() for line in results.stdout.splitlines() if line.strip()[:1].isdigit()]
    assert [row[0] for row in rows] == ["0", "1"], results.stdout  # rounds as the history numbers them

    as_csv = fedctl("export", run_id, "--format", "csv", "--out", "-", "--cloud", cloud, env=tokens)
    table = list(csv.DictReader(io.StringIO(as_csv.stdout)))
    assert [r["round"] for r in table] == ["0", "1"] and all(r["failed"] == "0" for r in table), as_csv.stdout
    out = tmp_path / "history.json"
    assert fedctl("export", run_id, "--format", "json", "--out", str(out), "--cloud", cloud, env=tokens).returncode == 0

    def refuse(constant: str) -> None:
        raise ValueError(constant)

    records = json.loads(out.read_text(), parse_constant=refuse)
    assert [r["round"] for r in records] == [0, 1] and all(0 <= r["test_accuracy"] <= 1 for r in records)
    png = tmp_path / "accuracy.png"
    assert fedctl("export", run_id, "--format", "png", "--out", str(png), "--cloud", cloud, env=tokens).returncode == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_sigterm_to_up_stops_every_process(standing: Standing):
    """Last of the module: the topology's own end."""
    assert not any(gone(pid) for pid in standing.pids)
    standing.proc.send_signal(signal.SIGTERM)
    assert standing.proc.wait(60) == 0
    assert wait_gone(standing.pids) == []
    assert not (standing.directory / "topology.json").exists()
    assert "stopped: every service of the topology has ended" in standing.lines[-1]


def test_down_stops_a_topology_whose_fedctl_was_killed(tmp_path):
    up = bring_up(tmp_path, "--edges", "1")
    try:
        again = fedctl("up", "--dir", str(tmp_path), "--cloud-port", "0", "--edge-port", "0")
        assert again.returncode == 1 and "a topology is already up in" in again.stderr, again.stderr
        up.proc.kill()  # SIGKILL: fedctl cannot stop its services; they run on in their own sessions
        up.proc.wait()
        assert not any(gone(pid) for pid in up.pids)
        down = fedctl("down", "--dir", str(tmp_path))
        assert down.returncode == 0, down.stderr
        assert "cloud" in down.stdout and "edge0" in down.stdout
        assert wait_gone(up.pids) == []
        assert "no topology is recorded" in fedctl("down", "--dir", str(tmp_path)).stderr
    finally:
        clean_up(up)


def test_sigterm_to_demo_stops_its_children(tmp_path):
    config = tmp_path / "long.toml"
    config.write_text('name = "long"\nrounds = 10000\n[model]\nname = "logreg"\n[data]\ndataset = "digits"\n'
                      'num_clients = 2\n')
    demo = subprocess.Popen([sys.executable, "-m", "fl_services.fedctl", "demo", "--config", str(config),
                             "--out", str(tmp_path / "out"), "--clients-per-process", "1"], cwd=ROOT, env=ENV,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    pids: list[int] = []
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:  # until its clients are up (the state file lists them)
            states = list((tmp_path / "out").glob("*/services/topology.json"))
            state = json.loads(states[0].read_text()) if states else {"processes": []}
            pids = [p["pid"] for p in state["processes"]]
            if sum(p["name"].startswith("client") for p in state["processes"]) == 2:
                break
            time.sleep(0.5)
        assert len(pids) == 5, state  # redis, cloud, edge, two client processes
        with CloudAPI(state["cloud_url"], LocalTopology.admin_token) as api:  # the demo's is the default token
            while not any(run.version >= 1 for run in api.runs()):  # training: a round or more in
                assert time.monotonic() < deadline, "the demo's run never reached version 1"
                time.sleep(0.2)
        demo.send_signal(signal.SIGTERM)
        demo.wait(60)
        assert wait_gone(pids) == []
    finally:
        if demo.poll() is None:
            demo.kill()
        for pid in pids:
            if not gone(pid):
                os.kill(pid, signal.SIGKILL)
