"""One cloud update as the cloud runs it, written once for the cloud service and the reference runner.

The cloud consumes a buffer of edge contributions: `cloud_update`, then the check that the new global
state is finite, then the round's figures (evaluation and the algorithm's server metrics). Where the
contributions come from and where the result goes is the caller's: the orchestrator reads them from
the Redis stream and commits the outcome in one transaction, the reference runner takes them from its
in-process edge rounds and keeps the outcome in memory. The history record of the update is built here
too, from the contributions, so both record the same.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from datetime import datetime

from fl_services.shared.core import roster
from fl_services.shared.core.algorithms import privacy, staleness
from fl_services.shared.core.algorithms.base import Algorithm, Contribution
from fl_services.shared.core.federation import cloud_evaluates, evaluate_global, federated_evaluations
from fl_services.shared.core.records import Record, non_finite
from fl_services.shared.core.reports import ClientFailureRecord, ClientRecord, ContributionRecord, RoundRecord
from fl_services.shared.core.secagg import sites
from fl_services.shared.core.training import Evaluation


class Diverged(ArithmeticError):
    """The update gave a global state with non-finite values (e.g. too large a learning rate).

    Publishing it would make every client fail on it, and recomputing gives the same: the cloud stops
    the run, the reference runner lets this propagate."""

    def __init__(self, version: int, names: list[str]):
        super().__init__(f"diverged: version {version} would have non-finite {names}")
        self.version, self.names = version, names


@dataclass(frozen=True)
class CloudRoundOutcome:
    global_: Record
    cloud_state: Record
    evaluation: Evaluation
    server_metrics: dict[str, float]
    epsilon: float | None = None  # ε spent once this update is published (None: no privacy noise)
    dp_sgd_epsilon: float | None = None  # DP-SGD's ε per training example (None: no DP-SGD)
    # Per contribution, in their order, the staleness weight s(τ) it counted with; None: dropped as too stale
    # (RunConfig.topology.staleness). Empty: every one counted as it came (an asynchronous algorithm's own rule).
    staleness_weights: tuple[float | None, ...] = ()


# A record's figures before its evaluation is in (NaN reads back from JSON: "nobody evaluated it").
NOT_EVALUATED = Evaluation(math.nan, math.nan, 0)


def run_cloud_round(algorithm: Algorithm, global_: Record, contributions: list[Contribution],
                    cloud_state: Record, version: int, evaluate: bool = True) -> CloudRoundOutcome:
    """The update of global state `version` with `contributions` as they arrived (Algorithm.to_wire's
    dtypes); raises Diverged rather than return a non-finite global state. With `evaluate` false its
    evaluation is NOT_EVALUATED: the cloud evaluates the new state (`evaluate_outcome`) off its critical
    path, once the new version is published; what it then records is the same. A run evaluated only on its
    devices (RunConfig.evaluation "federated") is never evaluated here: its figures stay NOT_EVALUATED. Under
    secure aggregation between sites, the update takes their unmasked total alone (shared/core/secagg/sites.py)."""
    # The devices its contributions declare are registered for the run from this update on (N grows).
    cloud_state = roster.joined(algorithm.config, cloud_state, contributions)
    scales: tuple[float | None, ...] = ()
    if algorithm.synchronous:  # buffered averaging (B < L) weighs the steps by staleness; B = L: every s is 1
        scales = staleness.weights(algorithm.config.topology.staleness, contributions, version)
    if any(sites.is_masked(c.tensors) for c in contributions):  # one total: no s(τ) can weigh a site's share
        contributions = [algorithm.from_wire(global_, sites.unmasked_total(algorithm, global_, contributions, scales))]
    else:
        contributions = [algorithm.from_wire(global_, c) for c in contributions]
        if algorithm.synchronous:
            contributions = staleness.weighted(contributions, scales)
    if contributions:
        new_global, new_state = algorithm.cloud_update(global_, contributions, cloud_state, version)
        new_state = roster.kept(algorithm.config, cloud_state, new_state)
    else:  # every one was too stale: the version moves on with the model as it was, and its record says why
        new_global, new_state = global_, cloud_state
    broken = non_finite(new_global)
    if broken:
        raise Diverged(version + 1, broken)
    metrics = {name: float(value) for name, value in algorithm.server_metrics(new_global, new_state).items()}
    outcome = CloudRoundOutcome(new_global, new_state, NOT_EVALUATED, metrics,
                                privacy.epsilon(algorithm.config, version + 1),
                                privacy.dp_sgd_epsilon(algorithm.config, version + 1), scales)
    return evaluate_outcome(algorithm, outcome) if evaluate and cloud_evaluates(algorithm.config) else outcome


def evaluate_outcome(algorithm: Algorithm, outcome: CloudRoundOutcome) -> CloudRoundOutcome:
    """The outcome with the evaluation of its new global state."""
    return replace(outcome, evaluation=evaluate_global(algorithm.config, algorithm, outcome.global_,
                                                       outcome.cloud_state))


def with_evaluation(record: RoundRecord, evaluation: Evaluation) -> RoundRecord:
    """The history record with the figures of its evaluation (in place of NOT_EVALUATED's)."""
    return record.model_copy(update={"test_loss": evaluation.loss, "test_accuracy": evaluation.accuracy})


def round_record(version: int, contributions: list[Contribution], outcome: CloudRoundOutcome,
                 started: datetime, run_started: datetime, finished: datetime, devices_modelled: bool = True
                 ) -> RoundRecord:
    """The history entry of the cloud update that consumed `contributions` at `version`: the clients of those
    that counted (a contribution dropped as too stale is listed as such, its clients are not). Without
    `devices_modelled` (RunConfig.dvfs.modelled) the DVFS figures (each client's device, the energy) are left
    out: not measured."""
    scales = outcome.staleness_weights or (1.0,) * len(contributions)
    counted = [c for c, s in zip(contributions, scales, strict=True) if s is not None]
    clients = sorted(
        (ClientRecord(client_id=c.client_id, edge_id=contribution.edge_id, num_samples=c.num_samples, loss=c.loss,
                      metrics=c.metrics, device=c.device if devices_modelled else None, evaluation=c.evaluation)
         for contribution in counted for c in contribution.participation),
        key=lambda c: (c.client_id, c.edge_id),
    )
    samples = max(sum(c.num_samples for c in clients), 1)
    names = sorted({name for c in clients for name in c.metrics})
    return RoundRecord(
        round=version,
        version=version + 1,
        edges=sorted({c.edge_id for c in contributions}),
        clients=clients,
        failed_clients=sorted(
            (ClientFailureRecord(client_id=f.client_id, edge_id=c.edge_id, error=f.error, kind=f.kind)
             for c in contributions for f in c.failures),
            key=lambda f: (f.client_id, f.edge_id),
        ),
        contributions=[
            ContributionRecord(edge_id=c.edge_id, base_version=c.base_version, staleness=version - c.base_version,
                               weight=c.weight, staleness_weight=1.0 if s is None else s, dropped=s is None,
                               members=None if c.members is None else sorted(m.client_id for m in c.members),
                               **({"joined": True, "clients": list(c.clients)} if c.joined else {}))
            for c, s in zip(contributions, scales, strict=True)
        ],
        train_loss=sum(c.loss * c.num_samples for c in clients) / samples,
        test_loss=outcome.evaluation.loss,
        test_accuracy=outcome.evaluation.accuracy,
        federated=federated_evaluations(contributions),
        client_metrics={
            name: sum(c.metrics[name] * c.num_samples for c in clients if name in c.metrics)
            / max(sum(c.num_samples for c in clients if name in c.metrics), 1)
            for name in names
        },
        server_metrics=outcome.server_metrics,
        energy_j=sum(c.device.energy_j for c in clients if c.device is not None) if devices_modelled else None,
        epsilon=outcome.epsilon,
        dp_sgd_epsilon=outcome.dp_sgd_epsilon,
        started_at=started,
        finished_at=finished,
        elapsed_s=(finished - run_started).total_seconds(),
    )
