"""Federated evaluation (RunConfig.evaluation): devices evaluate the global version their task carries on their
own held-out splits; edges and the cloud weight by samples; the services equal the reference runner."""
import math

import pytest

from fl_services.cloud.services.contributions import check_contribution
from fl_services.shared.core.algorithms import registry
from fl_services.shared.core.config import RunConfig
from fl_services.shared.core.data import load_federated
from fl_services.shared.core.federation import initial_model
from fl_services.shared.core.reports import ClientParticipation, EdgeContributionHeader, HeldOut, RunStatus
from fl_services.shared.core.tensors import InvalidContent
from fl_services.shared.core.training import evaluate
from tests.federation.checks import assert_same_federated, assert_same_model, reference, run
from tests.federation.harness import federation
from tests.federation.test_selected import FAST, IDS, TWO_SITES, selected

pytestmark = pytest.mark.anyio


def weighted(figures, field):
    return sum(getattr(f, field) * f.num_samples for f in figures) / sum(f.num_samples for f in figures)


async def test_federated_evaluation_over_two_sites_equals_the_reference(cloud_storage, tmp_path):
    config = RunConfig(name="fedeval", rounds=3, fraction=0.5, model={"name": "mlp"},
                       data={"num_clients": 6, "partition": "dirichlet"}, topology={"num_edges": 2},
                       evaluation="both")
    async with federation(cloud_storage, tmp_path, num_clients=6, num_edges=2) as fed:
        _, history, model = await run(fed.admin, config)
    expected = await reference(config)
    assert_same_model(model, expected.global_state)
    data = load_federated(config.data, config.seed)
    for got, ref in zip(history, expected.history, strict=True):
        # One version per synchronous update: the one the update started from, evaluated by every selected device.
        assert [f.version for f in got.federated] == [got.round]
        [fed_eval] = got.federated
        assert [s.edge_id for s in fed_eval.sites] == [0, 1]
        assert_same_federated(got, ref)
        devices = [c.evaluation for c in got.clients]
        assert all(d is not None for d in devices)
        assert [d.num_samples for d in devices] == [len(data.clients[c.client_id].test) for c in got.clients]
        assert fed_eval.num_samples == sum(d.num_samples for d in devices)
        assert fed_eval.accuracy == pytest.approx(weighted(devices, "accuracy"), rel=1e-12)
        assert fed_eval.loss == pytest.approx(weighted(devices, "loss"), rel=1e-12)
        for site in fed_eval.sites:
            mine = [c.evaluation for c in got.clients if c.edge_id == site.edge_id]
            assert site.num_samples == sum(d.num_samples for d in mine)
            assert site.accuracy == pytest.approx(weighted(mine, "accuracy"), rel=1e-12)
        assert not math.isnan(got.test_accuracy)  # "both": the cloud's test set too
    # Version 0 is the initial model: what each device reports of it is that model on its held-out split.
    first = initial_model(config)
    for c in history[0].clients:
        own = evaluate(first, data.clients[c.client_id].test)
        assert (c.evaluation.loss, c.evaluation.accuracy) == pytest.approx((own.loss, own.accuracy), abs=1e-6)


async def test_federated_only_leaves_the_cloud_figures_null(cloud_storage, tmp_path):
    config = RunConfig(name="fed-only", rounds=2, model={"name": "logreg"}, data={"num_clients": 3},
                       evaluation="federated")
    async with federation(cloud_storage, tmp_path, num_clients=3) as fed:
        run_id, history, _ = await run(fed.admin, config)
        response = await fed.cloud_request("GET", f"/api/v1/runs/{run_id}")
    expected = await reference(config)
    assert all(math.isnan(h.test_accuracy) and math.isnan(h.test_loss) for h in history)
    for got, ref in zip(history, expected.history, strict=True):
        assert_same_federated(got, ref)
    assert [f.version for h in history for f in h.federated] == [0, 1]
    body = response.json()
    assert body["config"]["evaluation"] == "federated"
    assert body["last_round"]["test_accuracy"] is None
    assert body["last_round"]["federated"][0]["version"] == 1
    assert body["last_round"]["federated"][0]["sites"][0]["edge_id"] == 0


async def test_a_cloud_evaluated_run_has_no_federated_figures():
    config = RunConfig(name="cloud", rounds=1, model={"name": "logreg"}, data={"num_clients": 2})
    expected = await reference(config)
    assert expected.history[0].federated == []
    assert all(c.evaluation is None for c in expected.history[0].clients)


@pytest.mark.parametrize(("overrides", "fragment"), [
    ({"evaluation": "devices"}, "'cloud', 'federated' or 'both'"),
    ({"evaluation": "federated", "algorithm": "fedrolex", "model": {"name": "mlp"}},
     "fedrolex does not support federated evaluation"),
])
async def test_a_run_whose_evaluation_cannot_be_honoured_is_refused(cloud_storage, tmp_path, overrides, fragment):
    async with federation(cloud_storage, tmp_path, num_clients=1, procs_per_edge=1) as fed:
        body = {"name": "bad", "rounds": 1, "data": {"num_clients": 1}, **overrides}
        response = await fed.cloud_request("POST", "/api/v1/runs", json=body)
        assert response.status_code == 422, response.text
        assert fragment in response.text
        assert await fed.admin.runs() == []


def test_the_cloud_refuses_a_site_evaluation_its_clients_do_not_give():
    config = RunConfig(rounds=1, model={"name": "logreg"}, data={"num_clients": 2}, evaluation="federated")
    algorithm = registry.create(config)
    global_ = algorithm.init_global(initial_model(config))
    device = HeldOut(loss=1.5, accuracy=0.25, num_samples=8)
    clients = [ClientParticipation(client_id=k, num_samples=40, loss=1.0, evaluation=device) for k in (0,)]
    tensors = {"model": {n: (40 * t).float() for n, t in global_["model"].items()}}

    def header(evaluation):
        return EdgeContributionHeader(run_id="r", edge_id=0, base_version=0, idempotency_key="k", weight=40.0,
                                      clients=clients, evaluation=evaluation)

    check_contribution(algorithm, global_, header(device), tensors)  # the weighted mean of one device: its own
    with pytest.raises(InvalidContent, match="not the sample-weighted mean"):
        check_contribution(algorithm, global_, header(device.model_copy(update={"accuracy": 0.9})), tensors)
    with pytest.raises(InvalidContent, match="not the sample-weighted mean"):
        check_contribution(algorithm, global_, header(None), tensors)
    cloud_only = registry.create(config.model_copy(update={"evaluation": "cloud"}))
    with pytest.raises(InvalidContent, match="carries no evaluation"):
        check_contribution(cloud_only, global_, header(device), tensors)


async def test_federated_evaluation_over_registered_devices_at_two_sites_equals_the_replay(cloud_storage, tmp_path):
    """Devices with their own ids and data sources, registered at two sites and selected by the run: each site's and
    the run's figures are the reference's replaying those devices, and the cloud evaluates nothing."""
    config = selected("fedeval-devices", {"algorithm": "fedavg", "evaluation": "federated"})
    async with federation(cloud_storage, tmp_path, num_clients=0, num_edges=2, devices=TWO_SITES, **FAST) as fed:
        info = await fed.admin.create_run(config)
        await fed.admin.action(info.run_id, "start")
        assert (await fed.admin.wait(info.run_id)).status == RunStatus.finished
        history = await fed.admin.history(info.run_id)
    want = await reference(info.config, devices=TWO_SITES)
    assert len(history) == len(want.history) == config.rounds
    for got, ref in zip(history, want.history, strict=True):
        assert [[s.edge_id for s in f.sites] for f in got.federated] == [[0, 1]]
        assert {c.client_id for c in got.clients} <= set(IDS)
        assert_same_federated(got, ref)
        assert math.isnan(got.test_accuracy)
