"""Warm starts (fl_services.fedctl.warm): a service forked from the forkserver behaves as the same service
started as `python -m`: settings from its environment, its argv, its log, its exit code, its own session,
the signals that stop it, also once the forkserver is gone; and the forkserver runs no thread that a fork could
leave half-copied."""
from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from fl_services.fedctl.launch import Service
from fl_services.fedctl.warm import COLD_ENV, WarmProcess, added_path, proc_stat, process_start_time

pytestmark = pytest.mark.slow

CLIENT = ["-m", "fl_services.client.main"]
# A client that retries an edge which never answers: it runs until stopped.
WAITING = {"FL_CLIENT_EDGE_URL": "http://127.0.0.1:9", "FL_CLIENT_CLIENTS": "0"}


def parent_of(pid: int) -> int:
    fields = proc_stat(pid)
    assert fields is not None, f"process {pid} is gone"
    return int(fields[1])


def run(tmp_path: Path, name: str, args: list[str], env: dict[str, str], cold: bool) -> tuple[int, str, type]:
    service = Service(name, [*CLIENT, *args], env, tmp_path / f"{name}.log", cold=cold)
    service.start()
    assert service.proc is not None
    kind, code = type(service.proc), service.proc.wait(120)
    service.stop()
    return code, service.log.read_text(), kind


@pytest.mark.parametrize("args, env", [
    (["--help"], {}),  # argv, and stdout to the log, flushed at exit
    ([], {"FL_CLIENT_TORCH_THREADS": "many"}),  # a setting from the environment, refused: exit 1
    (["--no-such-option"], {}),  # the usage error: exit 2 on stderr, naming `python -m` as the program
])
def test_a_warm_service_exits_as_the_cold_one(tmp_path: Path, args: list[str], env: dict[str, str]) -> None:
    cold = run(tmp_path, "cold", args, env, cold=True)
    warm = run(tmp_path, "warm", args, env, cold=False)
    assert (cold[2], warm[2]) == (subprocess.Popen, WarmProcess)
    assert warm[:2] == cold[:2]


def test_a_warm_service_runs_in_its_own_session_until_a_signal_stops_it(tmp_path: Path) -> None:
    codes = {}
    for sig in (signal.SIGTERM, signal.SIGKILL):
        service = Service(f"client-{sig}", CLIENT, WAITING, tmp_path / f"client-{sig}.log")
        service.start()
        proc = service.proc
        assert isinstance(proc, WarmProcess) and service.alive()
        assert os.getsid(proc.pid) == proc.pid
        forkserver = parent_of(proc.pid)
        assert len(os.listdir(f"/proc/{forkserver}/task")) == 1  # no thread (OpenMP's, say) to fork beside
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(0.5)
        service.stop(sig)
        assert not service.alive()
        codes[sig] = proc.returncode
    assert codes == {signal.SIGTERM: -signal.SIGTERM, signal.SIGKILL: -signal.SIGKILL}


def test_cold_when_asked_or_when_the_interpreter_would_start_otherwise(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    def started(env: dict[str, str]) -> type:
        service = Service("client", CLIENT, {**WAITING, **env}, tmp_path / "client.log")
        service.start()
        try:
            return type(service.proc)
        finally:
            service.stop()

    assert started({"PYTHONHASHSEED": "12345"}) is subprocess.Popen  # read as the interpreter starts
    monkeypatch.setenv(COLD_ENV, "1")
    assert started({}) is subprocess.Popen


@pytest.mark.parametrize("env, forkserver, added", [
    ({}, {}, []),
    ({"PYTHONPATH": "/a"}, {}, ["/a"]),
    ({"PYTHONPATH": f"/a{os.pathsep}/b"}, {"PYTHONPATH": "/b"}, ["/a"]),
    ({"PYTHONPATH": f"/b{os.pathsep}/a"}, {"PYTHONPATH": "/b"}, None),  # after the forkserver's: not in its order
    ({}, {"PYTHONPATH": "/b"}, None),
    ({"PYTHONPATH": "/a", "PYTHONHASHSEED": "1"}, {}, None),
])
def test_a_pythonpath_may_only_put_entries_first(env: dict[str, str], forkserver: dict[str, str],
                                                 added: list[str] | None) -> None:
    assert added_path(env, forkserver) == added


def put_first(entry: Path) -> str:
    """PYTHONPATH with `entry` put before what this process's own holds, as a user adds a directory to it."""
    return os.pathsep.join([str(entry), *filter(None, [os.environ.get("PYTHONPATH")])])


PROBE = """import numpy as np


def load(num_clients=1):
    x = np.zeros((10, 3), dtype=np.float32)
    return {"x_train": x, "y_train": np.arange(10) % 2, "x_test": x[:4], "y_test": np.arange(4) % 2,
            "client_train": np.zeros(10, dtype=np.int64)}
"""


def test_pythonpath_entries_put_first_start_warm_and_are_searched_first(tmp_path: Path) -> None:
    """A data set module on the service's own PYTHONPATH (a user's loader): found, in a warm service."""
    (tmp_path / "path").mkdir()
    (tmp_path / "path" / "warm_probe.py").write_text(PROBE)
    env = {**WAITING, "PYTHONPATH": put_first(tmp_path / "path"),
           "FL_CLIENT_DATA": "partition:warm_probe:load?clients=1&index=0"}
    service = Service("client", CLIENT, env, tmp_path / "client.log")
    service.start()
    try:
        assert isinstance(service.proc, WarmProcess)
        deadline = time.monotonic() + 60
        while "trains on its own data partition:warm_probe" not in service.log.read_text():
            assert service.alive() and time.monotonic() < deadline, service.log_tail()
            time.sleep(0.05)
    finally:
        service.stop()


def test_an_entry_that_would_shadow_an_imported_module_starts_as_the_cold_one_would(tmp_path: Path) -> None:
    """A cold interpreter would import that entry's httpx, not the one the forkserver holds: the warm child
    becomes that interpreter."""
    (tmp_path / "path").mkdir()
    (tmp_path / "path" / "httpx.py").write_text('raise SystemExit("httpx from PYTHONPATH")\n')
    env = {**WAITING, "PYTHONPATH": put_first(tmp_path / "path")}
    cold = run(tmp_path, "cold", [], env, cold=True)
    warm = run(tmp_path, "warm", [], env, cold=False)
    assert (cold[2], warm[2]) == (subprocess.Popen, WarmProcess)
    assert warm[:2] == cold[:2] == (1, "httpx from PYTHONPATH\n")


def test_a_warm_service_outlives_its_forkserver_and_is_still_stopped(tmp_path: Path) -> None:
    """A signal to the launcher's process group (a closed terminal's SIGHUP) ends the forkserver in it, but not
    the services, each in its own session: the launcher must still see them run and stop them."""
    service = Service("client", CLIENT, WAITING, tmp_path / "client.log")
    service.start()
    proc = service.proc
    assert isinstance(proc, WarmProcess)
    forkserver = parent_of(proc.pid)
    os.kill(forkserver, signal.SIGHUP)
    with pytest.raises(subprocess.TimeoutExpired):
        proc.wait(2)
    assert service.alive()
    service.stop()
    assert not service.alive() and process_start_time(proc.pid) is None
