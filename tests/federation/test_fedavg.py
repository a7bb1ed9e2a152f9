"""The foundation end to end: cloud + 1 edge + 10 clients (two client workers hosting five each) through the
services' HTTP APIs, against the in-process reference runner."""
import pytest

from fl_services.shared.core.config import RunConfig
from fl_services.shared.core.federation import initial_model
from tests.federation.checks import assert_same_model, reference, run
from tests.federation.harness import federation

pytestmark = pytest.mark.anyio


@pytest.fixture
async def fed(cloud_storage, tmp_path):
    async with federation(cloud_storage, tmp_path, num_clients=10) as fed:
        yield fed


async def test_fedavg_cnn_mnist_reaches_90_percent_and_equals_the_reference(fed):
    # 8 rounds: the reference's best accuracy by round 8 is 0.941, 0.932, 0.950 for seeds 0, 1, 2 (at least 0.03
    # above the bar; at round 6 seed 0 is at 0.901 and seed 1 at 0.888), so the claim holds with margin.
    config = RunConfig(name="fedavg-cnn", rounds=8, local={"epochs": 1, "batch_size": 32})
    _, history, model = await run(fed.admin, config, timeout_s=600)
    accuracies = [h.test_accuracy for h in history]
    assert max(accuracies) >= 0.90, accuracies
    assert [h.version for h in history] == list(range(1, config.rounds + 1))
    assert all(len(h.clients) == 10 and h.edges == [0] for h in history)
    assert all(c.num_samples > 0 for h in history for c in h.clients)
    expected = await reference(config)
    assert_same_model(model, expected.global_state)
    assert accuracies == pytest.approx([h.test_accuracy for h in expected.history], abs=2e-3)


async def test_fedsgd_partial_participation_equals_the_reference(fed):
    config = RunConfig(name="fedsgd", algorithm="fedsgd", rounds=4, fraction=0.3, model={"name": "mlp"},
                       local={"lr": 0.5})
    _, history, model = await run(fed.admin, config)
    expected = await reference(config)

    def selected(records):
        return [[c.client_id for c in h.clients] for h in records]

    assert selected(history) == selected(expected.history)
    assert all(len(h.clients) == 3 for h in history)
    assert_same_model(model, expected.global_state)


async def test_version_zero_model_is_downloadable_before_start(fed):
    config = RunConfig(name="v0", rounds=1, model={"name": "logreg"})
    info = await fed.admin.create_run(config)
    expected = {k: v.detach() for k, v in initial_model(config).named_parameters()}
    assert_same_model(await fed.admin.model(info.run_id), expected, atol=0)
    await fed.admin.action(info.run_id, "stop")
