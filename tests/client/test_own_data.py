"""A device's own data (fl-client --data SPEC, FL_CLIENT_DATA): its tasks train on it instead of the run's
partition, after checking that it fits the run's model; without it each client trains on its partition."""
from __future__ import annotations

import logging

import numpy as np
import pytest
from pydantic import ValidationError
from typer.testing import CliRunner

from fl_services.client import main as client_main
from fl_services.client.config import ClientSettings
from fl_services.client.worker import DataMisfit, client_data, compute
from fl_services.shared.core.algorithms import registry
from fl_services.shared.core.config import RunConfig
from fl_services.shared.core.data import load_client
from fl_services.shared.core.federation import initial_model
from fl_services.shared.core.records import decode
from fl_services.shared.wire.client_edge import ClientResultHeader, ClientTaskHeader

# The digits: 1x8x8 images, 10 classes.
CONFIG = RunConfig(name="digits-run", model={"name": "logreg"}, data={"dataset": "digits", "num_clients": 4})


def device_file(path, samples=50, shape=(1, 8, 8), classes=10):
    rng = np.random.default_rng(0)
    np.savez(path, x=rng.normal(size=(samples, *shape)).astype(np.float32), y=np.arange(samples) % classes)
    return path


def test_without_data_a_client_trains_on_its_partition(tmp_path):
    data = client_data(ClientSettings(state_dir=tmp_path), CONFIG, 2)
    assert data.train is load_client(CONFIG.data, CONFIG.seed, 2).train


def test_with_data_the_device_trains_on_its_own_split(tmp_path):
    path = device_file(tmp_path / "site.npz")
    data = client_data(ClientSettings(state_dir=tmp_path, data=f"npz:{path}?held_out=0.1"), CONFIG, 2)
    assert (len(data.train), len(data.test)) == (45, 5)
    assert data.train.x.shape[1:] == (1, 8, 8)


@pytest.mark.parametrize("shape, classes, reason", [
    ((8, 8), 10, "its samples have shape 8x8 but the run's model takes 1x8x8"),
    ((1, 8, 8), 12, "its labels 10, 11 lie outside the run's 10 classes (0 … 9)"),
])
def test_data_that_does_not_fit_the_run_is_refused_with_the_reason(tmp_path, shape, classes, reason):
    path = device_file(tmp_path / "site.npz", shape=shape, classes=classes)
    with pytest.raises(DataMisfit, match="does not fit run 'digits-run'") as raised:
        client_data(ClientSettings(state_dir=tmp_path, data=f"npz:{path}"), CONFIG, 0)
    assert reason in str(raised.value)


def test_a_task_reports_the_devices_own_sample_count(tmp_path):
    path = device_file(tmp_path / "site.npz", samples=30)
    header = ClientTaskHeader(task_id="t0", run_id="r", client_id=1, round=0, version=0, config=CONFIG)
    algorithm = registry.create(CONFIG)
    task = algorithm.client_task(algorithm.init_global(initial_model(CONFIG)), 1, 0)
    settings = ClientSettings(state_dir=tmp_path, dvfs_backend="emulate", data=f"npz:{path}")
    _, result = decode(compute(settings, header, task), ClientResultHeader)
    assert result.num_samples == 24  # 30 less the default fifth held out
    _, partition = decode(compute(ClientSettings(state_dir=tmp_path / "other", dvfs_backend="emulate"), header, task),
                          ClientResultHeader)
    assert partition.num_samples == len(load_client(CONFIG.data, CONFIG.seed, 1).train) != 24


def test_settings_refuse_a_bad_spec_and_more_than_one_client(tmp_path):
    with pytest.raises(ValidationError, match="unknown option 'lable' for csv"):
        ClientSettings(data="csv:/t.csv?lable=y")
    settings = ClientSettings(clients="0-1", data=f"npz:{tmp_path / 'site.npz'}")
    with pytest.raises(ValueError, match="host one client with it, not 2"):
        settings.hosted_ids()
    assert ClientSettings(clients="7", data=f"npz:{tmp_path / 'site.npz'}").hosted_ids() == [7]


def test_data_comes_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("FL_CLIENT_DATA", f"npz:{tmp_path / 'site.npz'}")
    assert ClientSettings().data == f"npz:{tmp_path / 'site.npz'}"


def test_a_device_whose_data_cannot_be_read_exits_at_start_saying_why(tmp_path, monkeypatch, caplog):
    monkeypatch.delenv("FL_CLIENT_CONFIG_FILE", raising=False)
    caplog.set_level(logging.INFO)
    missing = tmp_path / "absent.npz"
    result = CliRunner().invoke(client_main.app, ["--data", f"npz:{missing}", "--state-dir", str(tmp_path)])
    assert result.exit_code == 2
    assert isinstance(result.exception, SystemExit), result.exception
    assert "cannot read the npz data source" in caplog.text and str(missing) in caplog.text


def test_help_names_the_data_option(monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    result = CliRunner().invoke(client_main.app, ["--help"])
    assert result.exit_code == 0
    assert "FL_CLIENT_DATA; default unset" in result.output and "--data " in result.output
