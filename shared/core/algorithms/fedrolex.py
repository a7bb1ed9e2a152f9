"""FedRolex (Alam et al., NeurIPS 2022): rolling-window sub-models, as the seed specification writes it.

Client k has capacity β_k ∈ (0, 1]. In round r every hidden layer with K units (a conv layer: K
filters) gives client k the rolling window of max(⌊β_k·K⌋, 1) units starting at index r mod K,
wrapping around; the input of the first layer and the output of the last stay whole
(shared/core/algorithms/submodel.py has the windows, which tensor dimension each layer indexes, and the
extraction). The client builds the narrower model (`job.model_factory(**widths)`), loads the
window's weights and runs FedAvg's local SGD on it (E epochs, batch B, lr η_k; Nesterov selectable),
returning the sub-model's Δw_k = w_k − w_I.

Aggregation is per coordinate, over the selected clients whose window covers it:
    w ← w + (Σ_k p_k Δw_k) / (Σ_k p_k)        (coordinates nobody covered stay),
with p_k as in FedAvg (data sizes or 1; the normalisation over S cancels in the ratio). Each edge
embeds its clients' Δw_k at their windows and sends, per parameter, the float64 partial sums
Σ p̃_k Δw_k (its "model" group) and Σ p̃_k over the covering clients (its "coverage" group, full-size).
Both are associative, so several edges give the flat rule over all of S (multi_edge is allowed).

Capacities: `params.capacities` lists β_k per client (length N); in a run over registered devices it maps device
ids to β_k. Without it (or for a device it does not name), client k gets β_k = [1, ½, ¼][k mod 3], the mix the
specification's convergence claim is about. FedRolex keeps no server memory: a device that joins needs nothing
but its capacity. logreg has no hidden
layer, so every client gets the whole model and FedRolex is FedAvg.

Differences from the paper, following the specification: the server step has no learning rate η_s (the
specification's rule has none, so a run with server_lr ≠ 1 is refused rather than silently ignoring it);
the window starts at r mod K with r the round counted from 0 (the paper rolls by one unit a round
as well); the paper's static batch norm and output scaler are absent because our models have
neither. The window is a set of units; sub-models keep them in global order (see submodel.py).
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Annotated, ClassVar

import torch
from pydantic import BaseModel, ConfigDict, Field
from typing_extensions import TypeVar

from fl_services.shared.core.algorithms import aggregate, base
from fl_services.shared.core.algorithms.base import MODEL, Algorithm
from fl_services.shared.core.algorithms.submodel import (
    Architecture,
    Masks,
    Shapes,
    Windows,
    architecture_of,
    embed,
    extract,
    layer_windows,
)
from fl_services.shared.core.config import RunConfig
from fl_services.shared.core.federation import model_factory
from fl_services.shared.core.records import Record, RecordSpec
from fl_services.shared.core.tensors import MAX_ABS, InvalidContent, Tensors, TensorSpec
from fl_services.shared.core.training import load_parameters, local_sgd, parameters_of

DEFAULT_CAPACITIES = (1.0, 0.5, 0.25)
COVERAGE = "coverage"  # per coordinate, Σ p̃_k over the clients whose window covers it

Capacity = Annotated[float, Field(gt=0, le=1)]


class FedRolexParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    capacities: list[Capacity] | dict[int, Capacity] | None = Field(
        None, description="β_k per client (length N), or in a run over registered devices by device id; default "
        "β_k = [1, 1/2, 1/4][k mod 3]"
    )


def capacity_of(capacities: list[float] | dict[int, float] | None, client_id: int) -> float:
    if isinstance(capacities, list):
        return capacities[client_id]
    if capacities is not None and client_id in capacities:
        return capacities[client_id]
    return DEFAULT_CAPACITIES[client_id % len(DEFAULT_CAPACITIES)]


RP = TypeVar("RP", bound=FedRolexParams, default=FedRolexParams)


def coverage_reduce(items: Iterable[tuple[float, Tensors, Masks]]) -> aggregate.Partial:
    """Σ p_k Δw_k ("model") and Σ p_k per coordinate ("coverage"), float64 and full-size, over
    (p_k, Δw_k embedded at full size, coverage mask), with Σ p_k over the clients as the weight."""
    return aggregate.reduce(
        (weight, {MODEL: delta, COVERAGE: {n: m.to(torch.float64) for n, m in masks.items()}})
        for weight, delta, masks in items
    )


def covered_mean(sums: Record) -> Tensors:
    """Σ p_k Δw_k / Σ p_k where some client covered the coordinate, 0 where nobody did."""
    means = {}
    for name, total in sums[MODEL].items():
        weight = sums[COVERAGE][name]
        covered = weight > 0
        means[name] = torch.where(covered, total / torch.where(covered, weight, 1.0), 0.0)
    return means


class FedRolex(Algorithm[RP]):
    name = "fedrolex"
    multi_edge = True
    edge_rounds = False
    # The specification's FedRolex step has no η_s; FedSCAVAR's has one.
    has_server_lr: ClassVar[bool] = False
    federated_evaluation: ClassVar[bool] = False  # a device receives a sub-model, not the global one

    def __init__(self, config: RunConfig):
        super().__init__(config)
        self._full_shapes: dict[str, tuple[int, ...]] | None = None

    @classmethod
    def check_config(cls, config: RunConfig) -> None:
        super().check_config(config)
        architecture_of(config.model)  # an imported model cannot be cut into sub-models
        params = cls.Params.model_validate(config.params)
        assert isinstance(params, FedRolexParams)
        capacities = params.capacities
        if isinstance(capacities, dict) and config.selection is None:
            raise ValueError(f"{cls.name}: params.capacities names device ids only in a run over registered devices "
                             "(selection); a simulated run's is a list, one per client")
        if isinstance(capacities, list) and config.selection is not None:
            raise ValueError(f"{cls.name}: a run over registered devices names capacities by device id "
                             '(params.capacities = {"101": 0.5}): its devices are not 0 … N−1')
        if isinstance(capacities, list) and len(capacities) != config.data.num_clients:
            raise ValueError(
                f"{cls.name}: params.capacities has {len(capacities)} entries for {config.data.num_clients} clients"
            )
        if not cls.has_server_lr and config.server_lr != 1.0:
            raise ValueError(f"{cls.name}'s server step has no learning rate: server_lr must be 1")

    @property
    def architecture(self) -> Architecture:
        return architecture_of(self.config.model)

    @property
    def full_shapes(self) -> Shapes:
        """The global model's parameter shapes: the edge needs them to embed sub-model results.

        Taken from the global state when client_task sees it (it runs before edge_aggregate in every
        edge round), so an edge need not load the data set; else from a model built from the config.
        """
        if self._full_shapes is None:
            self._full_shapes = {n: tuple(p.shape) for n, p in model_factory(self.config)().named_parameters()}
        return self._full_shapes

    @full_shapes.setter
    def full_shapes(self, shapes: Shapes) -> None:
        self._full_shapes = dict(shapes)

    def capacity(self, client_id: int) -> float:
        return capacity_of(self.params.capacities, client_id)

    def windows(self, client_id: int, round: int, full_shapes: Shapes | None = None) -> Windows:
        shapes = self.full_shapes if full_shapes is None else full_shapes
        return layer_windows(self.architecture, shapes, self.capacity(client_id), round)

    def sub_model(self, job: base.LocalJob, weights: Tensors) -> torch.nn.Module:
        widths = self.architecture.widths({name: tuple(t.shape) for name, t in weights.items()})
        # The factory's first free positional argument is the init seed: widths go by keyword.
        return load_parameters(job.model_factory(**widths), weights)

    def embed_result(self, tensors: Tensors, client_id: int, round: int) -> tuple[Tensors, Masks]:
        return embed(tensors, self.architecture, self.windows(client_id, round), self.full_shapes)

    # ---- edge ----------------------------------------------------------------------------------
    def client_task(self, global_: Record, client_id: int, round: int) -> Record:
        model = self.model_parameters(global_)
        if self._full_shapes is None:
            self.full_shapes = {n: tuple(t.shape) for n, t in model.items()}
        return {MODEL: extract(model, self.architecture, self.windows(client_id, round))}

    def edge_aggregate(
        self, results: list[base.ClientResult], edge_state: Record, round: int, edge_id: int | None = None
    ) -> tuple[base.EdgeAggregate, Record]:
        ordered = sorted(results, key=lambda r: r.client_id)
        partial = coverage_reduce(
            (self.client_weight(r.num_samples), *self.embed_result(r.tensors[MODEL], r.client_id, round))
            for r in ordered
        )
        return base.EdgeAggregate(partial.sums, partial.weight), edge_state

    # ---- client --------------------------------------------------------------------------------
    def local_update(self, job: base.LocalJob, task: Record, state: Record) -> base.ClientUpdate:
        w = task[MODEL]
        model = self.sub_model(job, w)
        stats = local_sgd(model, job.data.train, self.config.local, job.generator)
        trained = parameters_of(model)
        delta = {name: (trained[name] - w[name]).contiguous() for name in w}
        return base.ClientUpdate({MODEL: delta}, len(job.data.train), stats.mean_loss, state)

    # ---- cloud ---------------------------------------------------------------------------------
    def contribution_spec(self, global_: Record, clients: list[int]) -> RecordSpec:
        full: TensorSpec = {name: (tuple(t.shape), torch.float64) for name, t in global_[MODEL].items()}
        return {MODEL: full, COVERAGE: dict(full)}

    def check_contribution(self, global_: Record, clients: list[int], tensors: Record, weight: float,
                           edge_id: int | None = None, population: int | None = None) -> None:
        """Also per coordinate: its weight lies in [0, weight], and its mean (sum / its weight) within
        ±MAX_ABS, nothing where nobody covered it. A 1e-300 coordinate weight under an ordinary sum would
        otherwise make that coordinate of the next model inf, whatever the contribution's total weight."""
        super().check_contribution(global_, clients, tensors, weight, edge_id)
        for name in global_[MODEL]:
            sums, covered = tensors[MODEL][name], tensors[COVERAGE][name]
            if bool((covered < 0).any()) or bool((covered > weight * (1 + 1e-9)).any()):
                raise InvalidContent(f"coverage of {name!r} must lie in [0, {weight:g}] (the weight)")
            if bool((sums.abs() > MAX_ABS * covered).any()):
                raise InvalidContent(f"tensor {name!r} has values beyond ±{MAX_ABS:g} times their weights "
                                     "in its coverage")

    def cloud_update(
        self, global_: Record, contributions: list[base.Contribution], cloud_state: Record, round: int
    ) -> tuple[Record, Record]:
        ordered = sorted(contributions, key=lambda c: c.edge_id)
        combined = aggregate.combine(aggregate.Partial(c.tensors, c.weight) for c in ordered)
        return {MODEL: aggregate.add_scaled(global_[MODEL], covered_mean(combined.sums), 1.0)}, cloud_state
