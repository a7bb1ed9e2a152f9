"""Devices with their own data through the services: a client worker with `data = npz:…` trains each round of a run
on its own file (its own sample count, its own loss), beside a simulated client on its partition, while a device
whose data does not fit the run's model reports why each round and the run goes on.

The run's data set is an imported loader: for it the edge checks no sample counts against a partition, which
is what lets a device's own count through while sites and devices are not yet registered entities."""
import math
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest

from fl_services.client.config import ClientSettings
from fl_services.client.worker import compute
from fl_services.shared.core.algorithms import registry
from fl_services.shared.core.config import RunConfig
from fl_services.shared.core.data import load_client
from fl_services.shared.core.federation import initial_model
from fl_services.shared.core.records import decode
from fl_services.shared.wire.client_edge import ClientResultHeader, ClientTaskHeader
from tests.federation.checks import run
from tests.federation.harness import Federation, federation

pytestmark = pytest.mark.anyio

# The run's task: (2, 3) samples, 3 classes (tests.shared.user_factories:as_dict).
CONFIG = RunConfig(name="own-data", rounds=3, model={"name": "logreg"},
                   data={"dataset": "tests.shared.user_factories:as_dict", "options": {"num_clients": 3},
                         "partition": "file", "num_clients": 3},
                   policy={"deadline_s": 60, "min_fraction": 0.5, "max_retries": 0})


def device_file(path: Path, shape: tuple[int, ...]) -> str:
    rng = np.random.default_rng(1)
    x = rng.normal(size=(30, *shape)).astype(np.float32)
    np.savez(path, x=x, y=(x.reshape(30, -1)[:, 0] > 0).astype(np.int64) + (x.reshape(30, -1)[:, 1] > 0))
    return f"npz:{path}"


def first_result(config: RunConfig, own: str, tmp_path: Path) -> ClientResultHeader:
    """What the device with data `own` reports for its task of round 0 (the initial model), computed directly."""
    algorithm = registry.create(config)
    task = algorithm.client_task(algorithm.init_global(initial_model(config)), 0, 0)
    header = ClientTaskHeader(task_id="t", run_id="r", client_id=0, round=0, version=0, config=config)
    settings = ClientSettings(state_dir=tmp_path / "direct", dvfs_backend="emulate", data=own)
    return decode(compute(settings, header, task), ClientResultHeader)[1]


@pytest.fixture
async def devices(cloud_storage, tmp_path) -> AsyncIterator[tuple[Federation, str]]:
    own, wrong = device_file(tmp_path / "site.npz", (2, 3)), device_file(tmp_path / "transposed.npz", (3, 2))
    # Three workers hosting clients 0, 1, 2: 0 and 2 are devices with their own data, 1 is simulated.
    data = {0: own, 2: wrong}
    async with federation(cloud_storage, tmp_path, num_clients=3, procs_per_edge=3,
                          client=lambda ids: {"data": data[ids[0]]} if ids[0] in data else {}) as fed:
        yield fed, own


async def test_a_device_trains_the_runs_rounds_on_its_own_file(devices, tmp_path, caplog):
    fed, own = devices
    _, history, _ = await run(fed.admin, CONFIG)
    partition = len(load_client(CONFIG.data, CONFIG.seed, 1).train)
    for h in history:
        assert {c.client_id: c.num_samples for c in h.clients} == {0: 24, 1: partition}  # 30 less its fifth held out
        assert [(f.client_id, f.kind) for f in h.failed_clients] == [(2, "misfit")]
        assert "DataMisfit" in h.failed_clients[0].error
        assert "its samples have shape 3x2 but the run's model takes 2x3" in h.failed_clients[0].error
    # The device says why in a line per task, without a traceback: nothing in its code is at fault.
    said = [r for r in caplog.records if r.getMessage().startswith("client 2: task ")]
    assert said and all("failed (misfit)" in r.getMessage() and not r.exc_info for r in said)
    # Round 0's loss is the local update of the initial model on the device's own training split.
    expected = first_result(CONFIG, own, tmp_path)
    assert history[0].clients[0].loss == pytest.approx(expected.loss, rel=1e-5)


async def test_a_device_evaluates_each_version_on_its_own_held_out_split(devices, tmp_path):
    """Federated evaluation: the device with its own file evaluates the version its task carries on its own held-out
    fifth (6 of 30 samples), the simulated client on its partition's; the site's and the run's figures are their
    sample-weighted means; the cloud evaluates nothing."""
    fed, own = devices
    config = CONFIG.model_copy(update={"name": "own-data-fedeval", "evaluation": "federated"})
    _, history, _ = await run(fed.admin, config)
    held_out = len(load_client(config.data, config.seed, 1).test)
    for h in history:
        assert {c.client_id: c.evaluation.num_samples for c in h.clients} == {0: 6, 1: held_out}
        [figures] = h.federated
        assert (figures.version, figures.num_samples, [s.edge_id for s in figures.sites]) ==\
            (h.round, 6 + held_out, [0])
        own_figures = [c.evaluation for c in h.clients]
        assert figures.accuracy == pytest.approx(sum(d.accuracy * d.num_samples for d in own_figures) / (6 + held_out))
        assert math.isnan(h.test_accuracy)  # not evaluated at the cloud
    # Version 0's figures are the initial model on the device's own held-out split, as the device computes them.
    expected = first_result(config, own, tmp_path)
    assert expected.evaluation is not None and expected.evaluation.num_samples == 6
    assert history[0].clients[0].evaluation.accuracy == expected.evaluation.accuracy
    assert history[0].clients[0].evaluation.loss == pytest.approx(expected.evaluation.loss, rel=1e-6)
