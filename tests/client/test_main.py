"""The client process: when every logical client stops for good, it exits non-zero and says why."""
from __future__ import annotations

import logging

import httpx
import pytest
import torch
from typer.testing import CliRunner

from fl_services.client import main as client_main
from fl_services.shared.wire.http import make_client


def test_process_exits_non_zero_when_the_edge_refuses_every_client(tmp_path, monkeypatch, caplog):
    refuse = httpx.MockTransport(lambda request: httpx.Response(401, json={"detail": "invalid bearer token"}))
    monkeypatch.setattr(client_main, "make_client", lambda *a, **kw: make_client(*a, transport=refuse, **kw))
    monkeypatch.delenv("FL_CLIENT_CONFIG_FILE", raising=False)
    caplog.set_level(logging.INFO)
    result = CliRunner().invoke(client_main.app, ["--clients", "0-1", "--state-dir", str(tmp_path)])
    assert result.exit_code == 1
    assert isinstance(result.exception, SystemExit), result.exception  # a clean exit, not a traceback
    assert "every logical client of this process stopped for good" in caplog.text
    assert "client 0" in caplog.text and "client 1" in caplog.text


def test_help_names_each_options_variable_and_default(monkeypatch):
    # A device's operator has only `fl-client --help` and the docs, which name FL_CLIENT_* variables.
    monkeypatch.setenv("COLUMNS", "200")
    result = CliRunner().invoke(client_main.app, ["--help"])
    assert result.exit_code == 0
    lines = {line.split()[1]: line for line in result.output.splitlines() if line.startswith("│ --")}
    expected = {"--edge": "FL_CLIENT_EDGE_URL; default http://127.0.0.1:8100",
                "--clients": "FL_CLIENT_CLIENTS; default 0",
                "--token": "FL_CLIENT_CLIENT_TOKEN; default dev-client-token",
                "--state-dir": "FL_CLIENT_STATE_DIR; default .fl-state",
                "--data-path": "FL_CLIENT_DATA_PATH; default unset",
                "--threads": "FL_CLIENT_TORCH_THREADS; default 1"}
    for option, text in expected.items():
        assert text in lines[option], lines[option]


def test_a_shard_that_holds_no_client_exits_with_one_line(tmp_path, monkeypatch, caplog):
    # A StatefulSet scaled beyond its client list: the surplus pod says so and exits, it does not sit idle.
    monkeypatch.delenv("FL_CLIENT_CONFIG_FILE", raising=False)
    monkeypatch.setenv("FL_CLIENT_SHARD_INDEX", "3")
    monkeypatch.setenv("FL_CLIENT_SHARD_COUNT", "4")
    result = CliRunner().invoke(client_main.app, ["--clients", "0-2", "--state-dir", str(tmp_path)])
    assert result.exit_code == 2
    assert isinstance(result.exception, SystemExit), result.exception
    assert "shard 3 of 4 holds none of the clients '0-2'" in caplog.text


def test_an_edge_url_without_a_scheme_is_refused_at_start_with_the_fix(tmp_path, monkeypatch):
    monkeypatch.delenv("FL_CLIENT_CONFIG_FILE", raising=False)
    result = CliRunner().invoke(client_main.app, ["--edge", "edge0:8100", "--state-dir", str(tmp_path)])
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), result.exception
    assert "FL_CLIENT_EDGE_URL: 'edge0:8100' is not an http:// or https:// URL: give the scheme, e.g. " \
           "http://edge0:8100" in str(result.exception.code)


def answering(body: dict | None, status: int = 200) -> httpx.MockTransport:
    def answer(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/health", request.url  # nothing else is asked of a service that is not an edge
        return httpx.Response(status, json=body) if body is not None else httpx.Response(status, text="<html>")
    return httpx.MockTransport(answer)


@pytest.mark.parametrize(("transport", "said"), [
    (answering({"status": "ok", "service": "cloud"}), "is the cloud, not an edge"),
    (answering(None), "is a service that does not say what it is, not an edge"),
    (answering({"detail": "Not Found"}, 404), "has no /health: it is not an edge"),
], ids=["the-cloud", "a-web-page", "no-health"])
def test_a_url_that_is_not_an_edge_fails_fast_with_a_hint(tmp_path, monkeypatch, caplog, transport, said):
    monkeypatch.setattr(client_main, "make_client", lambda *a, **kw: make_client(*a, transport=transport, **kw))
    monkeypatch.delenv("FL_CLIENT_CONFIG_FILE", raising=False)
    result = CliRunner().invoke(client_main.app, ["--edge", "http://cloud:8000", "--state-dir", str(tmp_path)])
    assert result.exit_code == 2 and isinstance(result.exception, SystemExit), result.exception
    assert f"http://cloud:8000 {said}" in caplog.text
    assert "FL_CLIENT_EDGE_URL (--edge) must name an edge" in caplog.text


def test_a_device_this_machine_lacks_stops_the_process_at_start_up_with_one_line(tmp_path, monkeypatch):
    monkeypatch.delenv("FL_CLIENT_CONFIG_FILE", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    result = CliRunner().invoke(client_main.app, ["--device", "cuda:1", "--state-dir", str(tmp_path)])
    assert result.exit_code != 0
    assert isinstance(result.exception, SystemExit), result.exception  # a clean exit, not a traceback
    assert "invalid settings: FL_CLIENT_DEVICE: device 'cuda:1': CUDA is not available on this machine" in result.output
