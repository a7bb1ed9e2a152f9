"""FedSGD (McMahan et al., 2017): one full-batch gradient step per round.

Client: g_k = ∇F_k(w), the gradient of its mean loss over all of D_k at the global weights.
Server: w ← w − η Σ_{k∈S} p_k g_k, where η = η_s · local.lr (η_s defaults to 1, so η is the run's
learning rate). It equals FedAvg with E = 1 and full batch at the same learning rate, which a test checks.
"""
from __future__ import annotations

from fl_services.shared.core.algorithms import aggregate
from fl_services.shared.core.algorithms.base import MODEL, ClientUpdate, Contribution, LocalJob, NoParams, combined_mean
from fl_services.shared.core.algorithms.fedavg import FedAvg
from fl_services.shared.core.records import Record
from fl_services.shared.core.training import full_gradient, load_parameters


class FedSGD(FedAvg[NoParams]):
    name = "fedsgd"
    edge_rounds = False  # an edge round would need a step size for gradients; not defined by the rule
    robust_aggregation = False  # not asked of gradient averaging (the robust rules are defined for FedAvg and FedProx)

    def local_update(self, job: LocalJob, task: Record, state: Record) -> ClientUpdate:
        model = load_parameters(job.model_factory(), task[MODEL])
        grads, loss = full_gradient(model, job.data.train)
        return ClientUpdate({MODEL: grads}, len(job.data.train), loss, state)

    def cloud_update(
        self, global_: Record, contributions: list[Contribution], cloud_state: Record, round: int
    ) -> tuple[Record, Record]:
        step = -self.config.server_lr * self.config.local.lr
        return {MODEL: aggregate.add_scaled(global_[MODEL], combined_mean(contributions)[MODEL], step)}, cloud_state
