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
from shared.algorithms.base import Algorithm, ClientUpdate, Contribution, EdgeAggregate, LocalJob, combined_mean
from shared.training import Regulariser, load_parameters, local_sgd, parameters_of
from shared.transport.tensors import Tensors


class FedAvg(Algorithm):
    name = "fedavg"
    edge_rounds = True

    def regulariser(self, global_: Tensors) -> Regulariser | None:
        """Extra term of the local objective; FedProx overrides this."""
        return None

    def local_update(self, job: LocalJob, task: Tensors, state: Tensors) -> ClientUpdate:
        model = load_parameters(job.model_factory(), task)
        stats = local_sgd(
            model, job.data.train, self.config.local, job.generator, regulariser=self.regulariser(task)
        )
        trained = parameters_of(model)
        delta = {name: trained[name] - task[name] for name in task}
        return ClientUpdate(delta, len(job.data.train), stats.mean_loss, state)

    def cloud_update(
        self, global_: Tensors, contributions: list[Contribution], cloud_state: Tensors, round: int
    ) -> tuple[Tensors, Tensors]:
        return aggregate.add_scaled(global_, combined_mean(contributions), self.config.server_lr), cloud_state

    def edge_round_update(self, edge_global: Tensors, aggregate_: EdgeAggregate) -> Tensors:
        mean = aggregate.mean(aggregate.Partial(aggregate_.tensors, aggregate_.weight))
        return aggregate.add_scaled(edge_global, mean, 1.0)

    def edge_contribution(self, global_: Tensors, edge_global: Tensors, aggregate_: EdgeAggregate) -> EdgeAggregate:
        drift = {name: (edge_global[name].to(torch.float64) - global_[name].to(torch.float64)) * aggregate_.weight
                 for name in global_}
        return EdgeAggregate({name: aggregate_.tensors[name] + drift[name] for name in global_}, aggregate_.weight)
