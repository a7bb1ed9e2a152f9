"""A researcher's own model and data (examples/custom_model) through the real services, as an operator deploys
them: the example is pip-installed (into a directory of its own, the project's venv staying as it is) and the cloud
and the client processes import it from there, the edges never (they build no model and load no data), and a client
process without it reports why while the run goes on. (The example's model and data trained and equal to the
reference, and the runs the cloud refuses to create: tests/federation/test_custom_model.py.)"""
import os
import shutil
import subprocess
import sys
import time

import pytest

from fl_services.fedctl.launch import ROOT
from fl_services.shared.core.reports import RunStatus
from tests.federation.test_custom_model import EXAMPLE, PACKAGE, example_config
from tests.integration.topology import federation, run

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> str:
    """Where `pip install examples/custom_model` put the package (built from a copy: the build writes its
    egg-info next to the sources)."""
    work = tmp_path_factory.mktemp("custom_model")
    shutil.copytree(EXAMPLE, work / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "build"))
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                    "--target", str(work / "site"), str(work / "src")], check=True)
    assert (work / "site" / PACKAGE / "models.py").is_file()
    return str(work / "site")


def test_a_client_that_cannot_import_the_model_reports_it_and_the_run_goes_on(tmp_path_factory, installed):
    """Client process 1 (clients 1 and 3) lacks the package: it logs the import error and reports it, the
    edge stops waiting for those clients (else each round would take the whole minute's deadline), and the
    history lists them as failed with the reason while the others train on, over the installed package."""
    env = {"PYTHONPATH": f"{ROOT}{os.pathsep}{installed}", "FL_CLOUD_ALLOWED_IMPORTS": PACKAGE}
    without = {"PYTHONPATH": str(ROOT)}
    with federation(tmp_path_factory, num_clients=4, extra_env=env, edge_env={0: without},
                    client_env={1: without}) as (topo, api):
        config = example_config(rounds=2, name="one-process-lacks-the-package",
                                policy={"deadline_s": 60, "min_fraction": 0.5, "max_retries": 0})
        started = time.monotonic()
        info, history, model = run(api, config)
        assert time.monotonic() - started < 60
        lacking_log = topo.clients[1].log_tail(200)
    assert info.status == RunStatus.finished
    assert set(model) == {"features.0.weight", "features.0.bias", "classifier.1.weight", "classifier.1.bias",
                          "classifier.3.weight", "classifier.3.bias"}
    assert [sorted(c.client_id for c in h.clients) for h in history] == [[0, 2], [0, 2]]
    for h in history:
        assert [(f.client_id, f.edge_id) for f in h.failed_clients] == [(1, 0), (3, 0)]
        for f in h.failed_clients:
            assert "cannot import the data loader 'fl_example_custom.data:load'" in f.error, f.error
            assert "No module named 'fl_example_custom'" in f.error
    assert "No module named 'fl_example_custom'" in lacking_log
