"""The one logging setup: logger names in every line; JSON lines with run_id, edge_id, client_id."""
from __future__ import annotations

import asyncio
import io
import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest

from fl_services.shared.runtime.log import bind, configure_logging


@pytest.fixture
def stream():
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield io.StringIO()
    root.handlers, root.level = handlers, level


def lines(stream: io.StringIO) -> list[dict]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_json_lines_carry_the_context_of_their_task(stream) -> None:
    configure_logging("info", "json", stream=stream, edge_id=3)

    async def logical_client(k: int) -> None:
        bind(client_id=k)  # each task its own context
        await asyncio.sleep(0)
        logging.getLogger("fl_services.client.worker").info("trained %d", k)

    async def main() -> None:
        bind(run_id="r1")
        await asyncio.gather(logical_client(0), logical_client(1))
        logging.getLogger("fl_services.edge.round_loop").warning("round done", extra={"client_id": 9})

    asyncio.run(main())
    logging.getLogger("shared.x").debug("below the level")
    try:
        raise ValueError("boom")
    except ValueError:
        logging.getLogger("fl_services.cloud.orchestrator").exception("failed")
    first, second, third, fourth = lines(stream)
    assert {(first["message"], first["client_id"]), (second["message"], second["client_id"])} ==\
        {("trained 0", 0), ("trained 1", 1)}
    assert first["logger"] == "fl_services.client.worker" and first["level"] == "INFO"
    assert first["run_id"] == "r1" and first["edge_id"] == 3  # the task's, and the process's default
    assert (third["logger"], third["client_id"], third["run_id"]) == ("fl_services.edge.round_loop", 9, "r1")
    assert fourth["logger"] == "fl_services.cloud.orchestrator" and "run_id" not in fourth  # outside the bound task
    assert "ValueError: boom" in fourth["exc_info"]
    assert fourth["time"].endswith("+00:00")


def test_text_lines_name_their_logger(stream) -> None:
    configure_logging("info", "text", stream=stream)
    logging.getLogger("fl_services.edge.tasks").info("hello")
    (line,) = stream.getvalue().splitlines()
    assert line.endswith(" INFO fl_services.edge.tasks: hello")


def test_a_second_setup_replaces_the_first(stream) -> None:
    other = io.StringIO()
    configure_logging("info", "text", stream=other)
    configure_logging("info", "json", stream=stream)
    logging.getLogger("x").info("once")
    assert other.getvalue() == "" and lines(stream)[0]["message"] == "once"


@pytest.mark.parametrize("settings_class", ["fl_services.cloud.config.CloudSettings",
                                            "fl_services.edge.config.EdgeSettings",
                                            "fl_services.client.config.ClientSettings"])
def test_every_service_reads_its_log_format(monkeypatch, settings_class: str) -> None:
    module, name = settings_class.rsplit(".", 1)
    cls = getattr(__import__(module, fromlist=[name]), name)
    prefix = cls.model_config["env_prefix"]
    monkeypatch.setenv(f"{prefix}LOG_FORMAT", "json")
    assert cls().log_format == "json"
    monkeypatch.setenv(f"{prefix}LOG_FORMAT", "xml")
    with pytest.raises(ValueError):
        cls()


def test_an_uncaught_exception_is_a_json_line_too() -> None:
    program = ("import threading\nfrom fl_services.shared.runtime.log import configure_logging\n"
               "configure_logging('info', 'json')\n"
               "t = threading.Thread(target=lambda: 1 / 0)\nt.start()\nt.join()\nraise RuntimeError('boom')\n")
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60,
                          cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 1
    records = [json.loads(line) for line in done.stderr.splitlines()]  # every line parses
    assert [(r["level"], r["message"]) for r in records] == [
        ("CRITICAL", "uncaught ZeroDivisionError: division by zero"), ("CRITICAL", "uncaught RuntimeError: boom")]
    assert records[1]["exc_info"].endswith("line 7, in <module>\nRuntimeError: boom")
