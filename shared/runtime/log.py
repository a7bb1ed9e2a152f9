"""One logging setup for every process (cloud, edge, client): the logger's name in every line, and an
optional JSON-lines format whose `run_id`, `edge_id` and `client_id` fields come from the context.

Loggers are `logging.getLogger(__name__)`. Context is bound per asyncio task with `bind(run_id=...)`
(a contextvar: each task, e.g. each logical client's loop, carries its own), or passed for one line
as `log.info(..., extra={"client_id": k})`; `configure_logging(..., edge_id=0)` sets a process-wide
default. uvicorn's loggers go through the same handler (see fl_services.shared.server.serve.serve: `log_config=None`).
"""
from __future__ import annotations

import json
import logging
import sys
import threading
from contextvars import ContextVar
from datetime import UTC, datetime
from types import TracebackType
from typing import Any, Literal, TextIO

LogFormat = Literal["text", "json"]
CONTEXT_FIELDS = ("run_id", "edge_id", "client_id")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

_context: ContextVar[dict[str, Any] | None] = ContextVar("fl_log_context", default=None)


def bind(**fields: Any) -> None:
    """Adds context fields to every line logged from now on in this task (and the tasks it starts)."""
    _context.set({**(_context.get() or {}), **fields})


class _ContextFilter(logging.Filter):
    """Gives every record the context fields: its own `extra`, else the task's, else the process's."""

    def __init__(self, defaults: dict[str, Any]):
        super().__init__()
        self.defaults = defaults

    def filter(self, record: logging.LogRecord) -> bool:
        context = _context.get() or {}
        for name in CONTEXT_FIELDS:
            if getattr(record, name, None) is None:
                setattr(record, name, context.get(name, self.defaults.get(name)))
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, the context fields and any traceback."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name in CONTEXT_FIELDS:
            value = getattr(record, name, None)
            if value is not None:
                line[name] = value
        if record.exc_info:
            line["exc_info"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


def configure_logging(level: str = "info", fmt: LogFormat = "text", stream: TextIO | None = None,
                      **defaults: Any) -> None:
    """One root handler writing `fmt` lines to `stream` (stderr), replacing the one an earlier call made.
    Other handlers stay (e.g. pytest's capture)."""
    handler = _Handler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    handler.addFilter(_ContextFilter({k: v for k, v in defaults.items() if k in CONTEXT_FIELDS}))
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _Handler)]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    logging.captureWarnings(True)  # Python's warnings as log lines too, so a JSON log stays JSON
    # And an exception nothing caught (on the main thread or another), which Python would print as a bare
    # traceback: a crash is the line a log reader most needs to parse.
    sys.excepthook = _log_uncaught
    threading.excepthook = lambda args: _log_uncaught(args.exc_type, args.exc_value, args.exc_traceback)


def _log_uncaught(exc_type: type[BaseException], value: BaseException | None, tb: TracebackType | None) -> None:
    exc = value if value is not None else exc_type()
    if issubclass(exc_type, (KeyboardInterrupt, SystemExit)):  # an interrupt or an exit, not a crash
        sys.__excepthook__(exc_type, exc, tb)
        return
    logging.getLogger("uncaught").critical("uncaught %s: %s", exc_type.__name__, exc, exc_info=(exc_type, exc, tb))


class _Handler(logging.StreamHandler[TextIO]):
    """The handler configure_logging installs (so that a second call replaces it)."""
