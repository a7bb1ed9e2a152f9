"""The foundation end to end: cloud + 1 edge + 10 clients (two client processes hosting five each)
over real HTTP and a real redis-server, against the in-process reference runner."""
import pytest
import torch

from fl_services.fedctl.api import CloudAPI
from fl_services.shared.core.config import RunConfig
from fl_services.shared.core.reference import run_reference
from fl_services.shared.core.reports import RunStatus
from tests.integration.topology import federation

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def api(tmp_path_factory):
    with federation(tmp_path_factory, num_clients=10) as (_, api):
        yield api


def run(api: CloudAPI, config: RunConfig):
    info = api.create_run(config)
    assert info.status == RunStatus.created and info.version == 0
    api.action(info.run_id, "start")
    final = api.wait(info.run_id, timeout_s=600)
    assert final.status == RunStatus.finished and final.version == config.rounds
    return final, api.history(info.run_id), api.model(info.run_id)


def assert_same_model(distributed, reference, atol=1e-5):
    assert distributed.keys() == reference.keys()
    for name in reference:
        assert torch.allclose(distributed[name], reference[name], atol=atol), name


def test_fedavg_cnn_mnist_reaches_90_percent_and_equals_the_reference(api):
    config = RunConfig(name="fedavg-cnn", rounds=10, local={"epochs": 1, "batch_size": 32})
    info, history, model = run(api, config)
    accuracies = [h.test_accuracy for h in history]
    assert max(accuracies) >= 0.90, accuracies
    assert [h.version for h in history] == list(range(1, 11))
    assert all(len(h.clients) == 10 and h.edges == [0] for h in history)
    assert all(c.num_samples > 0 for h in history for c in h.clients)
    reference = run_reference(config)
    assert_same_model(model, reference.global_state)
    assert accuracies == pytest.approx([h.test_accuracy for h in reference.history], abs=2e-3)


def test_fedsgd_partial_participation_equals_the_reference(api):
    config = RunConfig(name="fedsgd", algorithm="fedsgd", rounds=4, fraction=0.3, model={"name": "mlp"},
                       local={"lr": 0.5})
    _, history, model = run(api, config)
    reference = run_reference(config)
    def selected(records):
        return [[c.client_id for c in h.clients] for h in records]

    assert selected(history) == selected(reference.history)
    assert all(len(h.clients) == 3 for h in history)
    assert_same_model(model, reference.global_state)


def test_version_zero_model_is_downloadable_before_start(api):
    config = RunConfig(name="v0", rounds=1, model={"name": "logreg"})
    info = api.create_run(config)
    from fl_services.shared.core.federation import initial_model

    expected = dict(initial_model(config).named_parameters())
    got = api.model(info.run_id)
    assert_same_model(got, {k: v.detach() for k, v in expected.items()}, atol=0)
    api.action(info.run_id, "stop")
