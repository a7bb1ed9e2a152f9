"""FedAvg (McMahan et al., 2017).

Client: Δw_k = w_k − w after E epochs of minibatch SGD (batch B, lr η_k; Nesterov selectable) on D_k.
Server: w ← w + η_s Σ_{k∈S} p_k Δw_k, with p_k = |D_k| / Σ_{i∈S}|D_i| (weighting="samples") or
1/m (weighting="uniform"). With several edges, each edge sends Σ p̃_k Δw_k and Σ p̃_k over its
clients and the cloud divides the combined sums, which equals the flat rule over all of S.

Hierarchical FedAvg (topology.edge_rounds = κ > 1): each edge runs κ rounds of FedAvg (η = 1) on its
own model w_l, then submits W_l·(w_l − w) with weight W_l (its selected clients' total weight), so the
cloud's step is the data-weighted average of the edge models.
"""
from __future__ import annotations

import torch

from shared.algorithms import aggregate
from shared.algorithms.base import (
    MODEL,
    Algorithm,
    ClientUpdate,
    Contribution,
    EdgeAggregate,
    LocalJob,
    P,
    combined_mean,
)
from shared.training import Regulariser, load_parameters, local_sgd, parameters_of
from shared.transport.records import Record
from shared.transport.tensors import Tensors


class FedAvg(Algorithm[P]):
    name = "fedavg"
    edge_rounds = True

    def regulariser(self, global_: Tensors) -> Regulariser | None:
        """Extra term of the local objective; FedProx overrides this."""
        return None

    def local_update(self, job: LocalJob, task: Record, state: Record) -> ClientUpdate:
        w = task[MODEL]
        model = load_parameters(job.model_factory(), w)
        stats = local_sgd(
            model, job.data.train, self.config.local, job.generator, regulariser=self.regulariser(w)
        )
        trained = parameters_of(model)
        delta = {name: trained[name] - w[name] for name in w}
        return ClientUpdate({MODEL: delta}, len(job.data.train), stats.mean_loss, state)

    def cloud_update(
        self, global_: Record, contributions: list[Contribution], cloud_state: Record, round: int
    ) -> tuple[Record, Record]:
        step = combined_mean(contributions)[MODEL]
        return {MODEL: aggregate.add_scaled(global_[MODEL], step, self.config.server_lr)}, cloud_state

    def edge_round_update(self, edge_global: Record, aggregate_: EdgeAggregate) -> Record:
        mean = aggregate.mean(aggregate.Partial(aggregate_.tensors, aggregate_.weight))
        return {MODEL: aggregate.add_scaled(edge_global[MODEL], mean[MODEL], 1.0)}

    def edge_contribution(self, global_: Record, edge_global: Record, aggregate_: EdgeAggregate) -> EdgeAggregate:
        w, w_l, sums = global_[MODEL], edge_global[MODEL], aggregate_.tensors[MODEL]
        drift = {name: (w_l[name].to(torch.float64) - w[name].to(torch.float64)) * aggregate_.weight for name in w}
        return EdgeAggregate({MODEL: {name: sums[name] + drift[name] for name in w}}, aggregate_.weight)
