from typer.testing import CliRunner

from fedctl.__main__ import app
from shared.transport.wire import client_token


def test_client_token_prints_the_devices_own_token():
    result = CliRunner().invoke(app, ["client-token", "7", "--secret", "s3cret"])
    assert result.exit_code == 0, result.output
    assert result.output.strip() == client_token("s3cret", 7) != client_token("s3cret", 8)
