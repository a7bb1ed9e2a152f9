from typer.testing import CliRunner

from fedctl.__main__ import app
from shared.transport.wire import client_token


def test_client_token_prints_the_devices_own_token():
    result = CliRunner().invoke(app, ["client-token", "7", "--secret", "s3cret"])
    assert result.exit_code == 0, result.output
    assert result.output.strip() == client_token("s3cret", 7) != client_token("s3cret", 8)


def test_issue_token_prints_a_new_revocable_token_each_time():
    from shared.transport.wire import device_token_id

    first = CliRunner().invoke(app, ["issue-token", "7", "--secret", "s3cret"])
    second = CliRunner().invoke(app, ["issue-token", "7", "--secret", "s3cret"])
    assert first.exit_code == 0 and second.exit_code == 0, first.output
    tokens = [r.stdout.strip() for r in (first, second)]
    ids = [r.stderr.split()[2] for r in (first, second)]
    assert ids[0] != ids[1] and [device_token_id("s3cret", t, 7) for t in tokens] == ids
    assert device_token_id("s3cret", tokens[0], 8) is None
