"""A researcher's own model and data (examples/custom_model) through the real services: the example is
pip-installed (into a directory of its own, the project's venv staying as it is) and the cloud and the client
processes import it from there."""
import os
import shutil
import subprocess
import sys
import time
import tomllib

import pytest

from fl_services.fedctl.launch import ROOT
from fl_services.shared.core.config import RunConfig
from fl_services.shared.core.reference import run_reference
from fl_services.shared.core.reports import RunStatus
from tests.federation.checks import assert_same_model
from tests.integration.topology import federation, run
from tests.web import detail_of

pytestmark = pytest.mark.slow

EXAMPLE = ROOT / "examples" / "custom_model"


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> str:
    """Where `pip install examples/custom_model` put the package (built from a copy: the build writes its
    egg-info next to the sources)."""
    work = tmp_path_factory.mktemp("custom_model")
    shutil.copytree(EXAMPLE, work / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "build"))
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                    "--target", str(work / "site"), str(work / "src")], check=True)
    assert (work / "site" / "fl_example_custom" / "models.py").is_file()
    return str(work / "site")


def example_config(**overrides) -> RunConfig:
    data = tomllib.loads((EXAMPLE / "run.toml").read_text())
    data.update(overrides)
    return RunConfig.model_validate(data)


@pytest.fixture(scope="module")
def services(tmp_path_factory, installed):
    env = {"PYTHONPATH": f"{ROOT}{os.pathsep}{installed}", "FL_CLOUD_ALLOWED_IMPORTS": "fl_example_custom"}
    # Edges never build the model nor load the data: theirs lacks the package.
    with federation(tmp_path_factory, num_clients=4, extra_env=env, edge_env={0: {"PYTHONPATH": str(ROOT)}})\
            as (topo, api):
        yield topo, api


@pytest.fixture
def example_importable(monkeypatch, installed):
    """The in-process reference runner imports the example too."""
    monkeypatch.syspath_prepend(installed)


def test_custom_model_and_data_train_and_equal_the_reference(services, example_importable):
    _, api = services
    config = example_config(rounds=3)
    info, history, model = run(api, config)
    assert [len(h.clients) for h in history] == [4, 4, 4] and not any(h.failed_clients for h in history)
    # The loader's client index (rows dealt in turn) with the default 20% held out by each client.
    assert sorted(c.num_samples for c in history[0].clients) == [287, 287, 288, 288]
    assert history[-1].test_accuracy > 0.6, [h.test_accuracy for h in history]
    assert set(model) == {"features.0.weight", "features.0.bias", "classifier.1.weight", "classifier.1.bias",
                          "classifier.3.weight", "classifier.3.bias"}
    assert_same_model(model, run_reference(config).global_state)


def test_client_holdout_zero_trains_on_every_row(services, example_importable):
    _, api = services
    config = example_config(rounds=1, data={**example_config().data.model_dump(), "client_holdout": 0})
    _, history, _ = run(api, config)
    assert sorted(c.num_samples for c in history[0].clients) == [359, 359, 360, 360]


@pytest.mark.parametrize("change, fragments", [
    ({"model": {"name": "fl_example_custom.missing:make_net"}},
     ["fl_example_custom.missing:make_net", "No module named 'fl_example_custom.missing'"]),
    ({"model": {"name": "fl_example_custom.models:make_network"}}, ["has no function 'make_network'"]),
    ({"model": {"name": "fl_example_custom.models:make_net", "options": {"channels": 8, "width": 3}}},
     ["make_net", "unexpected keyword argument 'width'"]),
    # The 8×8 digits go through, but 1-D signals do not: the factory's own error.
    ({"data": {"dataset": "mnist1d"}}, ["make_net needs (channels, height, width) samples"]),
    ({"data": {"dataset": "fl_example_custom.data:load", "options": {"num_clients": 3}, "partition": "file",
               "num_clients": 2}}, ["client indices must lie in [0, 2)"]),
    ({"data": {"dataset": "fl_example_custom.data:missing"}}, ["has no function 'missing'"]),
    # A class is callable too, but outside FL_CLOUD_ALLOWED_IMPORTS.
    ({"model": {"name": "fl_services.shared.core.models:MLP"}},
     ["outside the packages this cloud may import", "fl_example_custom"]),
    # FedRolex narrows hidden layers it knows; an imported model's it does not.
    ({"algorithm": "fedrolex"}, ["sub-models need a built-in model"]),
])
def test_creation_refuses_what_cannot_run(services, change, fragments):
    topo, api = services
    body = {**example_config().model_dump(mode="json"), "name": "bad", **change}
    before = len(api.runs())
    detail_of(api.http.post("/api/v1/runs", json=body), 422, *fragments)
    assert len(api.runs()) == before


def test_a_client_that_cannot_import_the_model_reports_it_and_the_run_goes_on(services, example_importable):
    """Client process 1 (clients 1 and 3) lacks the package: it logs the import error and reports it, the
    edge stops waiting for those clients (else each round would take the whole minute's deadline), and the
    history lists them as failed with the reason while the others train on."""
    topo, api = services
    lacking = topo.clients[1]
    lacking.stop()
    lacking.env = {**lacking.env, "PYTHONPATH": str(ROOT)}
    lacking.start()
    topo.wait_registered()
    config = example_config(rounds=2, name="one-process-lacks-the-package",
                            policy={"deadline_s": 60, "min_fraction": 0.5, "max_retries": 0})
    started = time.monotonic()
    info, history, model = run(api, config)
    assert time.monotonic() - started < 60
    assert info.status == RunStatus.finished
    assert [sorted(c.client_id for c in h.clients) for h in history] == [[0, 2], [0, 2]]
    for h in history:
        assert [(f.client_id, f.edge_id) for f in h.failed_clients] == [(1, 0), (3, 0)]
        for f in h.failed_clients:
            assert "cannot import the data loader 'fl_example_custom.data:load'" in f.error, f.error
            assert "No module named 'fl_example_custom'" in f.error
    assert "No module named 'fl_example_custom'" in lacking.log_tail(200)
