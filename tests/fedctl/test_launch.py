"""A started service counts as healthy only once its own process answers: a 200 from whatever else listens on its
port (a service of a test running beside it) is not taken for it."""
from __future__ import annotations

import os
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from fl_services.fedctl.launch import Service, listens
from fl_services.fedctl.redis_server import free_port


class Ok(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def ok_server(port: int) -> ThreadingHTTPServer:
    return ThreadingHTTPServer(("127.0.0.1", port), Ok)


# A process that answers 200 to every GET on the port in argv[1], as a service's /health does.
SERVES = "import sys; from tests.fedctl.test_launch import ok_server; ok_server(int(sys.argv[1])).serve_forever()"


@pytest.fixture
def foreign() -> Iterator[int]:
    """The port of a server in this process that answers 200 to /health."""
    server = ok_server(0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def test_listens_names_the_process_holding_a_listening_port() -> None:
    with socket.socket() as listening, socket.socket() as bound:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        bound.bind(("127.0.0.1", 0))  # bound, not listening
        assert listens(os.getpid(), listening.getsockname()[1]) is True
        assert listens(os.getpid(), bound.getsockname()[1]) is False
        assert listens(os.getppid(), listening.getsockname()[1]) is False
        assert listens(2**22 + 1, listening.getsockname()[1]) is False  # above pid_max: no such process


def test_another_process_answering_on_the_port_is_not_the_service(tmp_path: Path, foreign: int) -> None:
    service = Service("idle", ["-c", "import time; time.sleep(60)"], {}, tmp_path / "idle.log",
                      url=f"http://127.0.0.1:{foreign}", cold=True)
    service.start()
    try:
        assert service.health().status_code == 200  # the foreign server answers
        with pytest.raises(RuntimeError, match="not healthy after 1.0s"):
            service.wait_healthy(timeout=1.0)
    finally:
        service.stop()


def test_the_service_answering_on_its_own_port_is_healthy(tmp_path: Path) -> None:
    port = free_port()
    service = Service("serves", ["-c", SERVES, str(port)], {}, tmp_path / "serves.log",
                      url=f"http://127.0.0.1:{port}", cold=True)
    service.start()
    try:
        service.wait_healthy(timeout=30.0)
        assert service.proc is not None and listens(service.proc.pid, port) is True
    finally:
        service.stop()
