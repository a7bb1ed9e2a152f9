"""FedAvg (McMahan et al., 2017).

Client: Δw_k = w_k − w after E epochs of minibatch SGD (batch B, lr η_k; Nesterov selectable) on D_k.
Server: w ← w + η_s Σ_{k∈S} p_k Δw_k, with p_k = |D_k| / Σ_{i∈S}|D_i| (weighting="samples") or
1/m (weighting="uniform"). With several edges, each edge sends Σ p̃_k Δw_k and Σ p̃_k over its
clients and the cloud divides the combined sums, which equals the flat rule over all of S.

Robust aggregation (RunConfig.aggregation, shared/core/algorithms/robust.py): an edge replaces the weighted mean
of its clients' steps by their median, trimmed mean or Krum r_l (every update counted once) and submits
W_l·r_l with weight W_l; the cloud may replace the mean of the edges' steps the same way (every edge counted
once). DP-FedAvg (RunConfig.privacy, shared/core/algorithms/privacy.py): an edge submits the sum of its n_l clients'
clipped steps plus Gaussian noise with weight n_l (weighting is uniform), or each client sends its own clipped,
noised step.

Hierarchical FedAvg (topology.edge_rounds = κ > 1): each edge runs κ rounds of FedAvg (η = 1) on its
own model w_l, then submits W_l·(w_l − w) with weight W_l (its selected clients' total weight), so the
cloud's step is the data-weighted average of the edge models.
"""
from __future__ import annotations

from typing import ClassVar

import torch

from fl_services.shared.core.algorithms import aggregate, base, privacy, robust
from fl_services.shared.core.algorithms.base import MODEL, Algorithm, P, combined_mean
from fl_services.shared.core.config import RunConfig
from fl_services.shared.core.records import Record
from fl_services.shared.core.tensors import Tensors
from fl_services.shared.core.training import Proximal, load_parameters, local_sgd, parameters_of


class FedAvg(Algorithm[P]):
    name = "fedavg"
    edge_rounds = True
    robust_aggregation = True
    secure_aggregation = True
    # Its update is a step, the mean of the clients' steps: a stale one can be weighed (algorithms/staleness.py).
    stale_refusal: ClassVar[str | None] = None

    @classmethod
    def check_config(cls, config: RunConfig) -> None:
        super().check_config(config)
        if cls.robust_aggregation:
            robust.check(config)
            privacy.check(config)
        if config.privacy.dp_sgd_noise_multiplier is not None and cls.proximal is not FedAvg.proximal:
            raise ValueError(f"{cls.name} adds a term to the local loss, which DP-SGD would drop: "
                             "privacy.dp_sgd_noise_multiplier needs fedavg")

    def proximal(self, global_: Tensors) -> Proximal | None:
        """Proximal term of the local objective; FedProx overrides this."""
        return None

    def local_update(self, job: base.LocalJob, task: Record, state: Record) -> base.ClientUpdate:
        w = task[MODEL]
        model = load_parameters(job.model_factory(), w)
        stats = local_sgd(
            model, job.data.train, self.config.local, job.generator, proximal=self.proximal(w),
            dp_sgd=privacy.dp_sgd(self.config.privacy),
        )
        trained = parameters_of(model)
        update: Record = {MODEL: {name: trained[name] - w[name] for name in w}}
        if self.config.privacy.noise == "client":
            update = privacy.privatised(self.config.privacy, update, job.generator)
        return base.ClientUpdate(update, len(job.data.train), stats.mean_loss, state)

    def cloud_update(
        self, global_: Record, contributions: list[base.Contribution], cloud_state: Record, round: int
    ) -> tuple[Record, Record]:
        return {MODEL: aggregate.add_scaled(global_[MODEL], self.cloud_step(contributions),
                                            self.config.server_lr)}, cloud_state

    def cloud_step(self, contributions: list[base.Contribution]) -> Tensors:
        """The combined model step: the mean over all clients, or the cloud's robust aggregator over the edges'
        mean steps (each edge counted once)."""
        name = self.config.aggregation.cloud
        if name == "mean":
            return combined_mean(contributions)[MODEL]
        steps = [aggregate.mean(aggregate.Partial(c.tensors, c.weight))
                 for c in sorted(contributions, key=lambda c: c.edge_id)]
        return robust.aggregate(name, self.config.aggregation, steps)[MODEL]

    def edge_aggregate(
        self, results: list[base.ClientResult], edge_state: Record, round: int, edge_id: int | None = None
    ) -> tuple[base.EdgeAggregate, Record]:
        name = self.config.aggregation.edge
        if name == "mean" and self.config.privacy.noise != "edge":  # the associative weighted sum
            return super().edge_aggregate(results, edge_state, round, edge_id)
        # A robust aggregator (or clipping each step) needs every result at once, not a running sum.
        ordered = sorted(results, key=lambda r: r.client_id)
        updates = [r.tensors for r in ordered]
        # The edge's weight stays its clients' total (what the cloud checks it against, and how the cloud's mean
        # weighs edges); with privacy, weighting is uniform, so it is the number of clients.
        weight = sum(self.client_weight(r.num_samples) for r in ordered)
        if self.config.privacy.noise == "edge":
            edge = self.config.edge_of_client(ordered[0].client_id) if edge_id is None else edge_id
            return base.EdgeAggregate(privacy.noised_sum(self.config, updates, round, edge), weight), edge_state
        step = robust.aggregate(name, self.config.aggregation, updates)
        # As a sum: the contribution keeps the form the cloud and κ > 1 edge rounds expect (sums / weight = step).
        sums = {g: {k: t * weight for k, t in ts.items()} for g, ts in step.items()}
        return base.EdgeAggregate(sums, weight), edge_state

    def edge_round_update(self, edge_global: Record, aggregate_: base.EdgeAggregate) -> Record:
        mean = aggregate.mean(aggregate.Partial(aggregate_.tensors, aggregate_.weight))
        return {MODEL: aggregate.add_scaled(edge_global[MODEL], mean[MODEL], 1.0)}

    def edge_contribution(self, global_: Record, edge_global: Record,
                          aggregate_: base.EdgeAggregate) -> base.EdgeAggregate:
        w, w_l, sums = global_[MODEL], edge_global[MODEL], aggregate_.tensors[MODEL]
        drift = {name: (w_l[name].to(torch.float64) - w[name].to(torch.float64)) * aggregate_.weight for name in w}
        return base.EdgeAggregate({MODEL: {name: sums[name] + drift[name] for name in w}}, aggregate_.weight)
