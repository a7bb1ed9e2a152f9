import json

from typer.testing import CliRunner

from fl_services.fedctl.__main__ import app
from fl_services.shared.wire.protocol import client_token


def test_client_token_prints_the_devices_own_token():
    result = CliRunner().invoke(app, ["client-token", "7", "--secret", "s3cret"])
    assert result.exit_code == 0, result.output
    assert result.output.strip() == client_token("s3cret", 7) != client_token("s3cret", 8)


def test_issue_token_prints_a_new_revocable_token_each_time():
    from fl_services.shared.wire.protocol import device_token_id

    first = CliRunner().invoke(app, ["issue-token", "7", "--secret", "s3cret"])
    second = CliRunner().invoke(app, ["issue-token", "7", "--secret", "s3cret"])
    assert first.exit_code == 0 and second.exit_code == 0, first.output
    tokens = [r.stdout.strip() for r in (first, second)]
    ids = [r.stderr.split()[2] for r in (first, second)]
    assert ids[0] != ids[1] and [device_token_id("s3cret", t, 7) for t in tokens] == ids
    assert device_token_id("s3cret", tokens[0], 8) is None


def test_issue_token_for_several_clients_writes_one_each_to_a_private_file(tmp_path):
    from fl_services.client.config import ClientSettings
    from fl_services.shared.wire.protocol import device_token_id

    out = tmp_path / "client0_tokens"
    result = CliRunner().invoke(app, ["issue-token", "0,2-3", "--out", str(out), "--secret", "s3cret"])
    assert result.exit_code == 0, result.output
    assert result.stdout == "" and out.stat().st_mode & 0o777 == 0o600
    ids = {int(line.split()[4].rstrip(";")): line.split()[2] for line in result.stderr.splitlines()}
    settings = ClientSettings(clients="0,2,3", client_tokens=json.loads(out.read_text()))
    assert {k: device_token_id("s3cret", settings.token_of(k), k) for k in settings.hosted_ids()} == ids
    again = CliRunner().invoke(app, ["issue-token", "1", "--out", str(out), "--secret", "s3cret"])
    assert again.exit_code != 0 and "exists" in again.output  # tokens still in use are not overwritten
    several = CliRunner().invoke(app, ["issue-token", "4-5", "--secret", "s3cret"])
    assert sorted(json.loads(several.stdout)) == ["4", "5"]


def test_issue_token_with_a_site_binds_the_token_to_it():
    from fl_services.shared.wire.protocol import device_token_grant

    result = CliRunner().invoke(app, ["issue-token", "7", "--site", "clinic-a", "--secret", "s3cret"])
    assert result.exit_code == 0, result.output
    token_id = result.stderr.split()[2]
    assert device_token_grant("s3cret", result.stdout.strip(), 7) == (token_id, "clinic-a")
    refused = CliRunner().invoke(app, ["issue-token", "7", "--site", "clinic~a", "--secret", "s3cret"])
    assert refused.exit_code == 2 and "--site" in refused.output


def test_control_refuses_an_action_it_does_not_have_before_calling_the_cloud():
    """A misspelt action is a usage error naming the four, not the cloud's '404 Not Found' for a run that exists
    (the cloud here is unreachable: a call would fail otherwise)."""
    result = CliRunner().invoke(app, ["control", "abc123", "strat", "--cloud", "http://127.0.0.1:9"])
    assert result.exit_code == 2, result.output
    assert "'strat': start, pause, resume or stop" in " ".join(result.output.split()), result.output
