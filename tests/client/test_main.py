"""The client process: when every logical client stops for good, it exits non-zero and says why."""
from __future__ import annotations

import logging

import httpx
from typer.testing import CliRunner

import client.main
from shared.transport.http import make_client


def test_process_exits_non_zero_when_the_edge_refuses_every_client(tmp_path, monkeypatch, caplog):
    refuse = httpx.MockTransport(lambda request: httpx.Response(401, json={"detail": "invalid bearer token"}))
    monkeypatch.setattr(client.main, "make_client", lambda *a, **kw: make_client(*a, transport=refuse, **kw))
    monkeypatch.delenv("FL_CLIENT_CONFIG_FILE", raising=False)
    caplog.set_level(logging.INFO)
    result = CliRunner().invoke(client.main.app, ["--clients", "0-1", "--state-dir", str(tmp_path)])
    assert result.exit_code == 1
    assert isinstance(result.exception, SystemExit), result.exception  # a clean exit, not a traceback
    assert "every logical client of this process stopped for good" in caplog.text
    assert "client 0" in caplog.text and "client 1" in caplog.text
