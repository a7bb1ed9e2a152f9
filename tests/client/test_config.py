import pytest
import torch
from pydantic import ValidationError

from fl_services.client.config import ClientSettings, parse_ids
from fl_services.shared.wire.protocol import issue_device_tokens, tokens_file_text


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


def test_client_tokens_from_a_file_give_each_hosted_client_its_own(tmp_path, monkeypatch):
    tokens = issue_device_tokens("secret", [0, 2])
    path = tmp_path / "tokens"
    path.write_text(tokens_file_text(tokens))
    monkeypatch.setenv("FL_CLIENT_CLIENT_TOKENS_FILE", str(path))
    settings = ClientSettings(clients="0,2")
    assert settings.hosted_ids() == [0, 2]
    assert [settings.token_of(k) for k in (0, 2)] == [tokens[0], tokens[2]]


def test_a_hosted_client_without_a_token_is_a_configuration_error():
    settings = ClientSettings(clients="0-2", client_tokens=issue_device_tokens("secret", [0, 2]))
    with pytest.raises(ValueError, match=r"no token for client\(s\) 1 "):
        settings.hosted_ids()
    # Only the hosted shard needs tokens: one file can serve every shard of a StatefulSet.
    assert ClientSettings(clients="0-2", shard_index=0, shard_count=2,
                          client_tokens=issue_device_tokens("secret", [0, 2])).hosted_ids() == [0, 2]


def test_an_issued_token_filed_under_another_client_is_refused():
    with pytest.raises(ValueError, match="the token given for client 3 is client 0's"):
        ClientSettings(client_tokens={3: issue_device_tokens("secret", [0])[0]})
    assert ClientSettings(client_tokens={3: "an opaque token"}).token_of(3) == "an opaque token"
    assert ClientSettings(client_token="shared").token_of(5) == "shared"


def test_device_defaults_to_the_cpu_and_refuses_what_this_machine_lacks(clean_env, monkeypatch):
    assert ClientSettings().compute_device == torch.device("cpu")
    assert ClientSettings(device="CPU").compute_device == torch.device("cpu")
    with pytest.raises(ValidationError, match="device must be auto, cpu, cuda or cuda:N, got 'gpu'"):
        ClientSettings(device="gpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for spec in ("cuda", "cuda:0", "cuda:3"):
        with pytest.raises(ValidationError, match=f"device '{spec}': CUDA is not available on this machine"):
            ClientSettings(device=spec)
    clean_env.setenv("FL_CLIENT_DEVICE", "auto")
    assert ClientSettings().compute_device == torch.device("cpu")
