"""One cloud update (shared/core/cloud_round.py): the divergence check, the server-metrics hook, the record."""
import math
from datetime import datetime, timezone

import pytest
import torch

from fl_services.shared.core import cloud_round
from fl_services.shared.core.algorithms.base import MODEL, Contribution
from fl_services.shared.core.algorithms.fedavg import FedAvg
from fl_services.shared.core.config import RunConfig
from fl_services.shared.core.reference import run_reference
from fl_services.shared.core.reports import ClientParticipation, RoundRecord
from fl_services.shared.core.training import Evaluation

CONFIG = RunConfig(model={"name": "logreg"}, data={"dataset": "digits", "num_clients": 4}, rounds=3)
AT = datetime.now(timezone.utc)


def zeros() -> dict[str, dict[str, torch.Tensor]]:
    return {MODEL: {"linear.weight": torch.zeros(10, 64), "linear.bias": torch.zeros(10)}}


def update(sums: dict[str, torch.Tensor], clients=(0,)) -> Contribution:
    return Contribution(0, 0, {MODEL: {n: t.double() for n, t in sums.items()}}, 1.0,
                        tuple(ClientParticipation(client_id=k, num_samples=3, loss=0.5) for k in clients))


def test_a_round_nobody_evaluated_reads_back_from_json():
    """An update whose clients reported no held-out figures has a NaN loss and accuracy; stored as
    JSON null it would not parse again and the run's info and history would answer 500."""
    outcome = cloud_round.CloudRoundOutcome({}, {}, Evaluation(math.nan, math.nan, 0), {})
    record = cloud_round.round_record(0, [update({})], outcome, AT, AT, AT)
    again = RoundRecord.model_validate_json(record.model_dump_json())
    assert math.isnan(again.test_loss) and math.isnan(again.test_accuracy)


def test_an_update_to_a_non_finite_model_raises_diverged_naming_the_tensors():
    # A mean step of 1e39 is finite in float64, where FedAvg sums, and inf in the model's float32.
    step = {"linear.weight": torch.zeros(10, 64), "linear.bias": torch.full((10,), 1e39, dtype=torch.float64)}
    names = r"\['model/linear.bias'\]"
    with pytest.raises(cloud_round.Diverged, match=rf"diverged: version 3 would have non-finite {names}") as caught:
        cloud_round.run_cloud_round(FedAvg(CONFIG), zeros(), [update(step)], {}, 2)
    assert (caught.value.version, caught.value.names) == (3, ["model/linear.bias"])


def test_a_finite_update_is_evaluated_and_keeps_the_state():
    step = {"linear.weight": torch.ones(10, 64), "linear.bias": torch.zeros(10)}
    outcome = cloud_round.run_cloud_round(FedAvg(CONFIG), zeros(), [update(step)], {"kept": {"x": torch.ones(1)}}, 0)
    assert torch.equal(outcome.global_[MODEL]["linear.weight"], torch.ones(10, 64))
    assert outcome.cloud_state.keys() == {"kept"}
    assert outcome.evaluation.samples > 0 and 0.0 <= outcome.evaluation.accuracy <= 1.0
    assert outcome.server_metrics == {}  # FedAvg reports none


def test_an_update_evaluated_after_it_is_published_records_the_same_figures():
    """The cloud publishes first and evaluates off its critical path; the reference evaluates at once."""
    step = {"linear.weight": torch.full((10, 64), 0.01), "linear.bias": torch.zeros(10)}
    inline = cloud_round.run_cloud_round(FedAvg(CONFIG), zeros(), [update(step)], {}, 0)
    later = cloud_round.run_cloud_round(FedAvg(CONFIG), zeros(), [update(step)], {}, 0, evaluate=False)
    assert later.evaluation is cloud_round.NOT_EVALUATED and math.isnan(later.evaluation.accuracy)
    record = cloud_round.round_record(0, [update(step)], later, AT, AT, AT)
    filled = cloud_round.with_evaluation(record, cloud_round.evaluate_outcome(FedAvg(CONFIG), later).evaluation)
    assert filled == cloud_round.round_record(0, [update(step)], inline, AT, AT, AT)


class NormReporting(FedAvg):
    """A FedAvg that reports the new model's norm, the way an algorithm adds a server-side figure."""

    def server_metrics(self, global_, cloud_state):
        norm = torch.linalg.vector_norm(global_[MODEL]["linear.weight"])
        return {"weight_norm": norm, "state_size": len(cloud_state)}


def test_server_metrics_of_the_hook_reach_the_record_and_its_json():
    step = {"linear.weight": torch.full((10, 64), 0.5), "linear.bias": torch.zeros(10)}
    contribution = update(step, clients=(2, 0))
    state = {"a": {"x": torch.ones(1)}}
    outcome = cloud_round.run_cloud_round(NormReporting(CONFIG), zeros(), [contribution], state, 0)
    assert outcome.server_metrics == {"weight_norm": pytest.approx(0.5 * math.sqrt(640)), "state_size": 1.0}
    assert all(type(v) is float for v in outcome.server_metrics.values())  # not tensors: they go to JSON
    record = cloud_round.round_record(0, [contribution], outcome, AT, AT, AT)
    assert RoundRecord.model_validate_json(record.model_dump_json()).server_metrics == outcome.server_metrics
    assert [c.client_id for c in record.clients] == [0, 2]


def test_the_reference_runner_stops_with_a_clear_error_when_the_model_diverges(monkeypatch):
    """The services' cloud stops such a run (tests/cloud/test_orchestrator.py); the runner raises."""
    cloud_update = FedAvg.cloud_update

    def blows_up_in_round_1(self, global_, contributions, cloud_state, round):
        new, state = cloud_update(self, global_, contributions, cloud_state, round)
        return ({MODEL: {n: t * math.inf for n, t in new[MODEL].items()}} if round == 1 else new), state

    monkeypatch.setattr(FedAvg, "cloud_update", blows_up_in_round_1)
    names = r"\['model/linear.bias', 'model/linear.weight'\]"
    with pytest.raises(cloud_round.Diverged, match=rf"diverged: version 2 would have non-finite {names}"):
        run_reference(CONFIG)
