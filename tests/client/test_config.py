import pytest

from client.config import ClientSettings, parse_ids


@pytest.mark.parametrize("spec, ids", [("3", [3]), ("0-4", [0, 1, 2, 3, 4]), ("0,2,5-7", [0, 2, 5, 6, 7]),
                                       (" 1 , 1 ", [1])])
def test_parse_ids(spec, ids):
    assert parse_ids(spec) == ids


@pytest.mark.parametrize("spec", ["", "4-2", "-1", "a"])
def test_parse_ids_rejects(spec):
    with pytest.raises(ValueError):
        parse_ids(spec)


def test_settings_from_toml_file_and_env_over_file(tmp_path, monkeypatch):
    config = tmp_path / "client.toml"
    config.write_text('edge_url = "http://edge:9000"\nclients = "0-9"\ntorch_threads = 2\n')
    monkeypatch.setenv("FL_CLIENT_CONFIG_FILE", str(config))
    monkeypatch.setenv("FL_CLIENT_TORCH_THREADS", "3")
    settings = ClientSettings()
    assert settings.edge_url == "http://edge:9000" and settings.clients == "0-9"
    assert settings.torch_threads == 3


def test_unknown_setting_in_file_is_an_error(tmp_path, monkeypatch):
    config = tmp_path / "client.toml"
    config.write_text('edge_ulr = "typo"\n')
    monkeypatch.setenv("FL_CLIENT_CONFIG_FILE", str(config))
    with pytest.raises(Exception, match="edge_ulr"):
        ClientSettings()
