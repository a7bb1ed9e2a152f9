"""A researcher's own model and data (examples/custom_model) through the services: the cloud, allowed to import the
example's package, and the clients build its model and load its data. (Installed with pip and imported by the
processes that need it, while a client process lacking it reports so and the run goes on:
tests/integration/test_custom_model_services.py.)"""
import sys
import tomllib
from collections.abc import AsyncIterator, Iterator

import pytest

from fl_services.fedctl.launch import ROOT
from fl_services.shared.core.config import RunConfig
from tests.federation.checks import assert_same_model, reference, run
from tests.federation.harness import Federation, federation
from tests.web import detail_of

pytestmark = pytest.mark.anyio

EXAMPLE = ROOT / "examples" / "custom_model"
PACKAGE = "fl_example_custom"


def example_config(**overrides) -> RunConfig:
    data = tomllib.loads((EXAMPLE / "run.toml").read_text())
    data.update(overrides)
    return RunConfig.model_validate(data)


@pytest.fixture
def example_importable(monkeypatch) -> Iterator[None]:
    """The example's package importable (its directory on the path, as its run.toml allows) for this test only."""
    monkeypatch.syspath_prepend(str(EXAMPLE))
    yield
    for name in [m for m in sys.modules if m == PACKAGE or m.startswith(f"{PACKAGE}.")]:
        del sys.modules[name]


@pytest.fixture
async def fed(cloud_storage, tmp_path, example_importable) -> AsyncIterator[Federation]:
    async with federation(cloud_storage, tmp_path, num_clients=4, cloud={"allowed_imports": PACKAGE}) as fed:
        yield fed


async def test_custom_model_and_data_train_and_equal_the_reference(fed):
    config = example_config(rounds=3)
    _, history, model = await run(fed.admin, config)
    assert [len(h.clients) for h in history] == [4, 4, 4] and not any(h.failed_clients for h in history)
    # The loader's client index (rows dealt in turn) with the default 20% held out by each client.
    assert sorted(c.num_samples for c in history[0].clients) == [287, 287, 288, 288]
    assert history[-1].test_accuracy > 0.6, [h.test_accuracy for h in history]
    assert set(model) == {"features.0.weight", "features.0.bias", "classifier.1.weight", "classifier.1.bias",
                          "classifier.3.weight", "classifier.3.bias"}
    assert_same_model(model, (await reference(config)).global_state)


async def test_client_holdout_zero_trains_on_every_row(fed):
    config = example_config(rounds=1, data={**example_config().data.model_dump(), "client_holdout": 0})
    _, history, _ = await run(fed.admin, config)
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
    # A class is callable too, but outside the cloud's allowed imports.
    ({"model": {"name": "fl_services.shared.core.models:MLP"}},
     ["outside the packages this cloud may import", "fl_example_custom"]),
    # FedRolex narrows hidden layers it knows; an imported model's it does not.
    ({"algorithm": "fedrolex"}, ["sub-models need a built-in model"]),
])
async def test_creation_refuses_what_cannot_run(cloud_storage, tmp_path, example_importable, change, fragments):
    body = {**example_config().model_dump(mode="json"), "name": "bad", **change}
    # The cloud alone: creation is decided there.
    async with federation(cloud_storage, tmp_path, num_clients=0, devices=[],
                          cloud={"allowed_imports": PACKAGE}) as fed:
        detail_of(await fed.cloud_request("POST", "/api/v1/runs", json=body), 422, *fragments)
        assert await fed.admin.runs() == []
