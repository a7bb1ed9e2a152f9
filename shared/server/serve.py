"""Serving with uvicorn: long-polls end as soon as the process is told to stop; connection limits and TLS."""
from __future__ import annotations

import resource
from types import FrameType

import uvicorn
from fastapi import FastAPI

from fl_services.shared.runtime import tune_collector
from fl_services.shared.server.app import Stopping
from fl_services.shared.server.deadlines import httptools_with_deadlines
from fl_services.shared.server.settings import ServerSettings


def serve(app: FastAPI, host: str, port: int, log_level: str, server: ServerSettings | None = None) -> None:
    """`uvicorn.run`, except that a stop signal sets `app.state.stopping` before the shutdown begins.
    `server`: its limits (connections, header deadline) and TLS options (`ServerSettings`).
    (Under a bare `uvicorn ... --factory` the long-polls run to their timeout: pass
    `--timeout-graceful-shutdown 1` there.)"""
    stopping: Stopping = app.state.stopping

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            stopping.set()
            super().handle_exit(sig, frame)

    server = server or ServerSettings()
    tune_collector()
    _allow_open_files(server.max_connections + 256)  # each connection is a file; Redis, logs, data besides
    # log_config=None: uvicorn's loggers go through the process's one setup (shared.runtime.log), not their own.
    # uvicorn's C-backed stack (docs/decisions/httptools-and-uvloop.md): the httptools protocol, with deadlines and
    # h11's 16 KiB cap on a request head, on uvloop's event loop (asyncio's where uvloop is not installed: Windows).
    # proxy_headers=False: uvicorn otherwise takes the caller's address from X-Forwarded-For whenever the
    # peer is 127.0.0.1, so any local caller wrote the address the audit log records; behind a proxy the
    # address is the proxy's, as docs/explanation-security-model.md says.
    Server(uvicorn.Config(app, host=host, port=port, log_level=log_level, log_config=None, proxy_headers=False,
                          http=httptools_with_deadlines(server.header_timeout_s), loop="auto",
                          limit_concurrency=server.max_connections, **server.tls_options())).run()


def _allow_open_files(wanted: int) -> None:
    """Raises this process's soft limit of open files towards `wanted` (as far as the hard limit allows):
    the common default of 1,024 would refuse the 1,000 long-polling edges or clients a service must hold."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted if hard == resource.RLIM_INFINITY else min(wanted, hard),
                                                    hard))
