"""FedSCAVAR: FedRolex sub-models + SCAFFOLD control variates + ClusterFedVARP server memory (issue 3).

State: the global state holds the model w and the server control c as "control.<param>" (c⁰ = 0);
client k keeps its control c_k (c_k⁰ = 0) at full size in its own state under "control.<param>",
because its window moves every round and the coordinates outside this round's window must keep
their values for later rounds. The cloud keeps one memory slot y_g per cluster, cloud_state
"y.<param>" of shape (G, *param.shape), float64, all 0 at first.

Round r, client k with capacity β_k and window I = I(r, β_k) (as FedRolex, shared/algorithms/submodel.py):
the client gets w_I and c_I, and from w_k = w_I runs E·|𝓑| steps on the sub-model
    w_k ← w_k − η_k (∇(ℓ(w_k; b) + μ/2 ‖w_k − w_I‖²) − c_{k,I} + c_I)
then, as SCAFFOLD on the window,
    c_{k,I}⁺ = c_{k,I} − c_I + (w_I − w_k) / (E·|𝓑|·η_k),   Δw_k = w_k − w_I,   Δc_k = c_{k,I}⁺ − c_{k,I},
keeps c_k with the window replaced by c_{k,I}⁺ (outside it unchanged) and sends (Δw_k, Δc_k) at window size.

The edge embeds Δw_k at its window in a full-size tensor (zero outside) and sends it per client
("client.<k>.<param>", float32: the cloud needs each Δw_k for the memory), plus the float64 partial
sum Σ p̃_k Δc_k (embedded) under "control.<param>" with weight Σ p̃_k. The cloud, with M_k the
coverage mask of client k's window and c_k ∈ [G] its cluster:
    v = (1/m) Σ_{k∈S} M_k ⊙ (Δw_k − y_{c_k}) + (1/N) Σ_{j=1..N} y_{c_j}
    w ← w + η_s v
    c ← c + (m/N) Σ_{k∈S} p_k Δc_k
    y_g ← per coordinate, the mean of Δw_i over i ∈ S ∩ C_g whose window covers it; unchanged where none does.

Choices the issue leaves open:
- y_{c_k} in the correction term is restricted to k's window (M_k ⊙ y_{c_k}), as the source notes
  write it (y_{c_k, I(r, β_k)}): a client says nothing about coordinates it did not train, and there
  the memory term (1/N) Σ_j y_{c_j} stands in for it. With β_k = 1 for all k this is ClusterFedVARP's v.
- m is the number of clients whose results reached the cloud (as FedVARP/ClusterFedVARP here), used
  both in v and in c's step (m/N); it equals max(⌊λN⌋, 1) whenever every selected client answers.
  p_k are FedAvg's weights normalised over those clients (`weighting`); v is unweighted as in the issue.
- The client→cluster map is ClusterFedVARP's run setting (`clusters`, or by default k-means with
  `num_clusters` on the clients' label histograms, shared.algorithms.clustering); capacities are
  FedRolex's (`capacities`, default [1, ½, ¼][k mod 3]); μ is one run-wide value (the notes' μ_k per
  client is not used). With Nesterov the SCAFFOLD denominator is scaffold.step_length's effective
  step length (see scaffold.py), E·|𝓑|·η_k for plain SGD.
- The memory spans all clients: one edge only (multi_edge = False), no edge rounds.
"""
from __future__ import annotations

from typing import ClassVar

import torch
from pydantic import Field

from shared.algorithms import aggregate
from shared.algorithms.base import Algorithm, ClientResult, ClientUpdate, Contribution, EdgeAggregate, LocalJob
from shared.algorithms.clusterfedvarp import ClusterMemory, ClusterParams
from shared.algorithms.fedprox import proximal_term
from shared.algorithms.fedrolex import FedRolex, FedRolexParams
from shared.algorithms.fedvarp import (
    buffered_clients,
    check_client_ids,
    client_name,
    memory_bytes,
    memory_name,
    stored_memory,
)
from shared.algorithms.scaffold import client_controls, control_name, split_state, step_length
from shared.algorithms.submodel import Shapes, coverage, embed, extract
from shared.training import local_sgd, parameters_of
from shared.transport.tensors import Tensors, TensorSpec


class FedSCAVARParams(ClusterParams, FedRolexParams):
    mu: float = Field(0.01, ge=0, description="μ: weight of the proximal term μ/2 ‖w_k − w‖²")


def masked_varp_direction(deltas: torch.Tensor, masks: torch.Tensor, memory: torch.Tensor, rows: torch.Tensor,
                          sizes: torch.Tensor, num_clients: int) -> torch.Tensor:
    """v = (1/m) Σ_i M_i ⊙ (Δ_i − y_{rows[i]}) + (1/N) Σ_g sizes[g] y_g, in float64.

    deltas, masks: (m, *shape), Δ_i embedded at full size and its coverage; memory: (G, *shape);
    rows: (m,) the cluster of each client; sizes: (G,) clients per cluster. With all masks 1 this is
    fedvarp.varp_direction.
    """
    deltas, memory, masks = deltas.to(torch.float64), memory.to(torch.float64), masks.to(torch.float64)
    weights = sizes.to(torch.float64).reshape(-1, *([1] * (memory.dim() - 1)))
    return (masks * (deltas - memory[rows])).mean(0) + (weights * memory).sum(0) / num_clients


def covered_memory(memory: torch.Tensor, deltas: torch.Tensor, masks: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """y_g ← per coordinate, the mean of the Δ_i with rows[i] = g that cover it; elsewhere unchanged."""
    shape = memory.shape
    sums = torch.zeros(shape, dtype=torch.float64).index_add_(0, rows, (masks * deltas).to(torch.float64))
    counts = torch.zeros(shape, dtype=torch.float64).index_add_(0, rows, masks.to(torch.float64))
    hit = counts > 0
    return torch.where(hit, sums / torch.where(hit, counts, 1.0), memory.to(torch.float64)).to(memory.dtype)


class FedSCAVAR(ClusterMemory, FedRolex):
    name = "fedscavar"
    Params = FedSCAVARParams
    params: FedSCAVARParams
    multi_edge = False  # the cluster memory spans all clients
    edge_rounds = False
    has_server_lr: ClassVar[bool] = True

    # ---- cloud ---------------------------------------------------------------------------------
    def init_global(self, model: torch.nn.Module) -> Tensors:
        w = super().init_global(model)
        return {**w, **{control_name(n): torch.zeros_like(t) for n, t in w.items()}}

    def model_parameters(self, global_: Tensors) -> Tensors:
        return split_state(global_)[0]

    def _check_clients(self, clients: list[int]) -> None:
        check_client_ids(self.name, clients, self.config.data.num_clients)

    def contribution_spec(self, global_: Tensors, clients: list[int]) -> TensorSpec:
        self._check_clients(clients)
        w, _ = split_state(global_)
        spec: TensorSpec = {client_name(k, n): (tuple(t.shape), t.dtype) for k in sorted(clients) for n, t in w.items()}
        spec.update({control_name(n): (tuple(t.shape), torch.float64) for n, t in w.items()})
        return spec

    def server_memory_bytes(self, global_: Tensors) -> int:
        return memory_bytes(self.memory_groups(), split_state(global_)[0], lambda _: torch.float64)

    # Its contributions carry no coverage weights (the cloud recomputes the windows): FedRolex's check does not apply.
    check_contribution = Algorithm.check_contribution

    def cloud_update(
        self, global_: Tensors, contributions: list[Contribution], cloud_state: Tensors, round: int
    ) -> tuple[Tensors, Tensors]:
        groups = self.memory_groups()
        b = buffered_clients(self.name, contributions, groups)
        clients = b.ids
        w, _ = split_state(global_)
        shapes: Shapes = {n: tuple(t.shape) for n, t in w.items()}
        # The windows are a function of (client, round): the cloud recomputes them instead of shipping masks.
        masks = {k: coverage(self.architecture, self.windows(k, round, shapes), shapes) for k in clients}
        step: Tensors = {}
        new_state: Tensors = {}
        for name, param in w.items():
            memory = stored_memory(cloud_state, name, param, b.num_groups, torch.float64)
            deltas = torch.stack([b.source[k].tensors[client_name(k, name)] for k in clients])
            covered = torch.stack([masks[k][name] for k in clients])
            step[name] = masked_varp_direction(deltas, covered, memory, b.rows, b.sizes, len(groups))
            new_state[memory_name(name)] = covered_memory(memory, deltas, covered, b.rows).contiguous()
        ordered = sorted(contributions, key=lambda c: c.edge_id)
        control = aggregate.combine(
            aggregate.Partial({n: c.tensors[control_name(n)] for n in w}, c.weight) for c in ordered
        )
        new = aggregate.add_scaled(global_, step, self.config.server_lr)
        c_step = {control_name(n): t for n, t in aggregate.mean(control).items()}
        return aggregate.add_scaled(new, c_step, len(clients) / self.config.data.num_clients), new_state

    # ---- edge ----------------------------------------------------------------------------------
    def client_task(self, global_: Tensors, client_id: int, round: int) -> Tensors:
        sub_w = super().client_task(global_, client_id, round)
        sub_c = extract(split_state(global_)[1], self.architecture, self.windows(client_id, round))
        return {**sub_w, **{control_name(n): t for n, t in sub_c.items()}}

    def edge_aggregate(
        self, results: list[ClientResult], edge_state: Tensors, round: int
    ) -> tuple[EdgeAggregate, Tensors]:
        if not results:
            raise ValueError("cannot aggregate an empty set of results")
        tensors: Tensors = {}
        items = []
        for r in sorted(results, key=lambda r: r.client_id):
            dw, dc = split_state(r.tensors)
            full_dw, _ = self.embed_result(dw, r.client_id, round)
            full_dc, _ = self.embed_result(dc, r.client_id, round)
            tensors.update({client_name(r.client_id, n): t for n, t in full_dw.items()})
            items.append((self.client_weight(r.num_samples), full_dc))
        control = aggregate.reduce(items)
        tensors.update({control_name(n): t for n, t in control.sums.items()})
        return EdgeAggregate(tensors, control.weight), edge_state

    # ---- client --------------------------------------------------------------------------------
    def local_update(self, job: LocalJob, task: Tensors, state: Tensors) -> ClientUpdate:
        w, c = split_state(task)
        # The run's full-width model gives the shapes c_k is kept at.
        full_shapes: Shapes = {n: tuple(p.shape) for n, p in job.model_factory().named_parameters()}
        windows = self.windows(job.client_id, job.round, full_shapes)
        c_k_full = {n: state[control_name(n)] if control_name(n) in state else torch.zeros(s)
                    for n, s in full_shapes.items()}
        c_k = extract(c_k_full, self.architecture, windows)
        if any(tuple(c_k[n].shape) != tuple(t.shape) for n, t in w.items()):
            raise ValueError(f"task for client {job.client_id} in round {job.round} does not match its window")
        model = self.sub_model(job, w)
        centre = {n: t.detach().clone() for n, t in w.items()}
        mu = self.params.mu
        cfg = self.config.local
        stats = local_sgd(
            model, job.data.train, cfg, job.generator,
            regulariser=(lambda m: proximal_term(m, centre, mu)) if mu > 0 else None,
            correction={n: (c[n] - c_k[n]).to(w[n].dtype) for n in w},
        )
        w_k = parameters_of(model)
        c_plus, delta_c = client_controls(c, c_k, w, w_k, step_length(cfg, stats.steps))
        placed, covered = embed(c_plus, self.architecture, windows, full_shapes)
        new_state = {control_name(n): torch.where(covered[n], placed[n], c_k_full[n]).contiguous() for n in w}
        tensors = {n: (w_k[n] - w[n]).contiguous() for n in w}
        tensors.update({control_name(n): delta_c[n] for n in w})
        return ClientUpdate(tensors, len(job.data.train), stats.mean_loss, new_state)
