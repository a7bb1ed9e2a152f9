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


@pytest.mark.parametrize("index, count, ids", [(0, 1, [0, 2, 4, 6, 8]), (0, 2, [0, 4, 8]), (1, 2, [2, 6]),
                                               (2, 3, [4])])
def test_shards_split_the_clients_without_overlap(index, count, ids):
    settings = ClientSettings(clients="0,2,4,6,8", shard_index=index, shard_count=count)
    assert settings.hosted_ids() == ids
    every = [i for k in range(count) for i in
             ClientSettings(clients="0,2,4,6,8", shard_index=k, shard_count=count).hosted_ids()]
    assert sorted(every) == [0, 2, 4, 6, 8]


def test_shard_index_beyond_count_is_refused():
    with pytest.raises(ValueError, match="shard_index 2 must be below shard_count 2"):
        ClientSettings(shard_index=2, shard_count=2)


def test_a_shard_with_no_clients_is_an_error():
    with pytest.raises(ValueError, match="holds none"):
        ClientSettings(clients="0-1", shard_index=2, shard_count=3).hosted_ids()
