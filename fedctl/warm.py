"""Warm starts: a service of this interpreter's own modules forked from multiprocessing's forkserver, which
imported the service modules once, instead of a fresh `python -m` that spends seconds of CPU importing torch,
fastapi and the rest before it serves (docs/decisions/warm-service-starts.md).

A warm service behaves as the cold one: its own session, the environment, working directory, argv and log it
would have been given, run as `__main__`, its exit functions run and its exit code kept. FL_LAUNCH_COLD=1 (or
LocalTopology(cold=True)) starts every service as a plain process."""
from __future__ import annotations

import atexit
import contextlib
import importlib.machinery
import multiprocessing
import multiprocessing.forkserver
import multiprocessing.process
import os
import re
import runpy
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Mapping
from pathlib import Path

# A warm service runs one of them.
SERVICE_MODULES = ("fl_services.cloud.main", "fl_services.edge.main", "fl_services.client.main")
# What the forkserver imports once besides: what those import only once their settings are read (so that their
# --help answers without torch), the apps the cloud and the edge serve and the client's training.
SERVED_MODULES = ("fl_services.cloud.app", "fl_services.edge.app", "fl_services.shared.server.serve",
                  "fl_services.client.worker")
COLD_ENV = "FL_LAUNCH_COLD"

_lock = threading.Lock()
# The interpreter's start-up settings of the environment the forkserver was started with.
_forkserver_startup: dict[str, str] | None = None


def startup_settings(env: Mapping[str, str]) -> dict[str, str]:
    """The variables an interpreter or its loader reads as it starts (PYTHONPATH, PYTHONHASHSEED, LD_PRELOAD...),
    which a forked process cannot take from its own environment: it started long before."""
    return {k: v for k, v in env.items() if k.startswith(("PYTHON", "LD_"))}


def cold_asked() -> bool:
    return os.environ.get(COLD_ENV, "") not in ("", "0")


def main_importable() -> bool:
    """Whether this process's main module may be imported again, as multiprocessing does in the forkserver: run
    with -m or -c, or a script whose top level is guarded by `if __name__ == "__main__":`. An unguarded script
    would run its whole body (its own topology, say) once more in the forkserver."""
    main = sys.modules["__main__"]
    path = getattr(main, "__file__", None)
    if getattr(main.__spec__, "name", None) is not None or path is None:
        return True
    try:
        return re.search(r"""^if __name__ == ["']__main__["']:""", Path(path).read_text(errors="replace"),
                         re.MULTILINE) is not None
    except OSError:
        return False


def added_path(env: Mapping[str, str], expected: Mapping[str, str]) -> list[str] | None:
    """The PYTHONPATH entries that `env` puts before those of `expected` (both start-up settings), where it
    differs from `expected` in nothing else; None where it does."""
    mine, theirs = dict(startup_settings(env)), dict(expected)
    path, base = _entries(mine.pop("PYTHONPATH", "")), _entries(theirs.pop("PYTHONPATH", ""))
    if mine != theirs or path[len(path) - len(base):] != base:
        return None
    return path[:len(path) - len(base)]


def _entries(pythonpath: str) -> list[str]:
    return pythonpath.split(os.pathsep) if pythonpath else []


def can_start_warm(args: list[str], env: dict[str, str]) -> bool:
    """Whether `python *args` with `env` may start warm: a service module, with the start-up settings the
    forkserver has (or will have, started from this environment) but for PYTHONPATH entries put before its
    own, from a process whose main module the forkserver can import."""
    if cold_asked() or len(args) < 2 or args[0] != "-m" or args[1] not in SERVICE_MODULES:
        return False
    if not main_importable():
        return False
    return added_path(env, _expected_startup()) is not None


def _expected_startup() -> dict[str, str]:
    return _forkserver_startup if _forkserver_startup is not None else startup_settings(os.environ)


def shadowed(entries: list[str]) -> list[str]:
    """The modules this interpreter imported that one started with `entries` first on PYTHONPATH would import
    from another file, found in one of them (and site's customize modules, which it would run as it starts)."""
    found = [name for name in ("sitecustomize", "usercustomize")
             if importlib.machinery.PathFinder.find_spec(name, entries) is not None]
    for name in sorted({name.partition(".")[0] for name in list(sys.modules)}):
        module = sys.modules.get(name)
        if module is None or getattr(module.__spec__, "origin", None) in ("built-in", "frozen"):
            continue  # found before any path entry is searched
        spec = importlib.machinery.PathFinder.find_spec(name, entries)
        if spec is None:
            continue
        imported = getattr(module, "__file__", None) or next(iter(getattr(module, "__path__", None) or []), None)
        there = spec.origin if spec.has_location else next(iter(spec.submodule_search_locations or []), None)
        if imported is None or there is None or os.path.realpath(imported) != os.path.realpath(there):
            found.append(name)
    return found


def _forkserver_context() -> multiprocessing.context.ForkServerContext:
    global _forkserver_startup
    context = multiprocessing.get_context("forkserver")
    with _lock:
        if _forkserver_startup is None:
            # "__main__": the forkserver imports this process's main module once, which each child would
            # otherwise import again (multiprocessing prepares a child so).
            context.set_forkserver_preload(["__main__", *SERVICE_MODULES, *SERVED_MODULES])
            multiprocessing.forkserver.ensure_running()
            _forkserver_startup = startup_settings(os.environ)
    return context


def proc_stat(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name, which may hold spaces (proc(5) numbers them from 3:
    [0] the state, [1] the parent's pid, [11] and [12] user and system time, [19] the start time), or None if
    the process is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()


def process_start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot, or None if it is gone or a zombie: with the pid, it
    names one process even after the pid is reused."""
    fields = proc_stat(pid)
    return None if fields is None or fields[0] in ("Z", "X") else int(fields[19])


class WarmProcess:
    """A forked service with the part of subprocess.Popen's interface Service uses (pid, poll, wait, send_signal,
    terminate, kill, returncode); its exit code is the forkserver's report of it, negative for a signal."""

    def __init__(self, args: list[str], env: dict[str, str], cwd: Path, log: Path) -> None:
        self.args = args
        self.returncode: int | None = None
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, [])
        context = _forkserver_context()
        added = added_path(env, _expected_startup())
        assert added is not None, "can_start_warm said no"
        self._process = context.Process(
            target=_serve, args=(args[1], args[2:], env, str(cwd), str(Path(log).absolute()), mask, added),
            name=args[1])
        self._process.start()
        # Started, it runs until stopped, as a Popen child does: multiprocessing would otherwise join it when
        # this interpreter exits, hanging an owner that ends without stopping its topology.
        multiprocessing.process._children.discard(self._process)  # type: ignore[attr-defined]
        assert self._process.pid is not None
        self.pid: int = self._process.pid
        self._started = process_start_time(self.pid)
        # Returns once the service is in its own session, as Popen(start_new_session=True) does: a Ctrl-C at
        # the terminal must not reach it.
        with contextlib.suppress(ProcessLookupError):
            while os.getsid(self.pid) != self.pid and self.poll() is None:
                time.sleep(0.001)

    def poll(self) -> int | None:
        if self.returncode is None:
            code = self._process.exitcode
            # A forkserver that died (a SIGHUP or SIGTERM to the launcher's process group) reports each of its
            # services as ended (255) while it runs on in its own session: it ended once its pid is gone.
            if code is not None and not (self._started is not None and process_start_time(self.pid) == self._started):
                self.returncode = code
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        self._process.join(timeout)
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(self.args, timeout or 0)
            time.sleep(0.05)
        return code

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:  # not yet reaped by the forkserver, so the pid is still this process's
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def _serve(module: str, argv: list[str], env: dict[str, str], cwd: str, log: str, mask: set[int],
           added: list[str]) -> None:
    """In the forked child: becomes what `python -m module *argv` started by subprocess.Popen(cwd, env, stdout
    and stderr to log, start_new_session=True) would be, then runs the module as `__main__`. With `added`
    PYTHONPATH entries that would have that interpreter import a module from another file than the one this
    process imported, it becomes that interpreter instead (exec)."""
    os.setsid()
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    if added and shadowed(added):
        os.execve(sys.executable, [sys.executable, "-m", module, *argv], env)
    if sys.path[:1] != [cwd]:
        sys.path.insert(0, cwd)  # `python -m` searches its working directory first
    sys.path[1:1] = added  # then the PYTHONPATH entries
    sys.argv = [module, *argv]  # runpy sets argv[0] to the module's file, as `python -m` does
    # The forkserver imported it under its own name; `python -m` runs it afresh as __main__ only.
    sys.modules.pop(module, None)
    code = 0
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as e:
        if isinstance(e.code, int) or e.code is None:
            code = e.code or 0
        else:
            print(e.code, file=sys.stderr)
            code = 1
    except BaseException:
        traceback.print_exc()
        code = 1
    # What the interpreter does as it exits, which multiprocessing's child (it ends with os._exit) does not:
    # wait for the non-daemon threads (and their exit hooks), then the atexit functions (logging's flush).
    threading._shutdown()  # type: ignore[attr-defined]
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    sys.exit(code)
