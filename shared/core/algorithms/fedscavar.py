"""FedSCAVAR: FedRolex sub-models + SCAFFOLD control variates + ClusterFedVARP server memory, as the seed
specification writes it.

State: the global state holds the model w ("model") and the server control c ("control", c⁰ = 0);
client k keeps its control c_k (c_k⁰ = 0) at full size in its own state's "control" group, because
its window moves every round and the coordinates outside this round's window must keep their values
for later rounds. The cloud keeps one memory slot y_g per cluster, the cloud state's "memory" group,
per parameter of shape (G, *param.shape), float64, all 0 at first. The control variates are SCAFFOLD's
piece (control.py), the memory maths FedVARP's (fedvarp.py) with each client's coverage as its mask.

Round r, client k with capacity β_k and window I = I(r, β_k) (as FedRolex, shared/core/algorithms/submodel.py):
the client gets w_I and c_I, and from w_k = w_I runs E·|𝓑| steps on the sub-model
    w_k ← w_k − η_k (∇(ℓ(w_k; b) + μ/2 ‖w_k − w_I‖²) − c_{k,I} + c_I)
then, as SCAFFOLD on the window,
    c_{k,I}⁺ = c_{k,I} − c_I + (w_I − w_k) / (E·|𝓑|·η_k),   Δw_k = w_k − w_I,   Δc_k = c_{k,I}⁺ − c_{k,I},
keeps c_k with the window replaced by c_{k,I}⁺ (outside it unchanged) and sends (Δw_k, Δc_k) at window size.

The edge embeds Δw_k at its window in a full-size tensor (zero outside) and sends it per client
(FedVARP's "deltas" group, float32: the cloud needs each Δw_k for the memory), plus the partial sum
Σ p̃_k Δc_k (embedded; summed in float64, sent as float32) as its "control" group with weight Σ p̃_k.
The cloud, with M_k the coverage mask of client k's window and c_k ∈ [G] its cluster:
    v = (1/m) Σ_{k∈S} M_k ⊙ (Δw_k − y_{c_k}) + (1/N) Σ_{j=1..N} y_{c_j}
    w ← w + η_s v
    c ← c + (m/N) Σ_{k∈S} p_k Δc_k
    y_g ← per coordinate, the mean of Δw_i over i ∈ S ∩ C_g whose window covers it; unchanged where none does.

Choices the specification leaves open:
- y_{c_k} in the correction term is restricted to k's window (M_k ⊙ y_{c_k}), as the source notes
  write it (y_{c_k, I(r, β_k)}): a client says nothing about coordinates it did not train, and there
  the memory term (1/N) Σ_j y_{c_j} stands in for it. With β_k = 1 for all k this is ClusterFedVARP's v.
- m is the number of clients whose results reached the cloud (as FedVARP/ClusterFedVARP here), used
  both in v and in c's step (m/N); it equals max(⌊λN⌋, 1) whenever every selected client answers.
  p_k are FedAvg's weights normalised over those clients (`weighting`); v is unweighted as in the specification.
- The client→cluster map is ClusterFedVARP's run setting (`clusters`, or by default k-means with
  `num_clusters` on the clients' label histograms, fl_services.shared.core.algorithms.clustering); capacities are
  FedRolex's (`capacities`, default [1, ½, ¼][k mod 3]); μ is one run-wide value (the notes' μ_k per
  client is not used). With Nesterov the SCAFFOLD denominator is control.step_length's effective
  step length (scaffold.py says why), E·|𝓑|·η_k for plain SGD.
- The memory spans all clients: one edge only (multi_edge = False), no edge rounds.
- N is the run's devices (shared/core/roster.py), in v's (1/N) and in c's (m/N): in a run over registered devices,
  those declared as members so far; a joining device gets its cluster as ClusterFedVARP's do (a new cluster's
  slot starts at 0), c_k = 0 on the device, and its capacity from `capacities` (by device id) or the default.
"""
from __future__ import annotations

from typing import ClassVar

import torch

from fl_services.shared.core import roster
from fl_services.shared.core.algorithms import aggregate, base
from fl_services.shared.core.algorithms.base import MODEL, Algorithm, combined_mean
from fl_services.shared.core.algorithms.clusterfedvarp import ClusterMemory, ClusterParams
from fl_services.shared.core.algorithms.control import CONTROL, control_step, corrected_sgd, kept_control, with_control
from fl_services.shared.core.algorithms.fedprox import FedProxParams
from fl_services.shared.core.algorithms.fedrolex import FedRolex, FedRolexParams
from fl_services.shared.core.algorithms.fedvarp import (
    DELTAS,
    MEMORY,
    buffered_clients,
    check_client_ids,
    deltas_spec,
    memory_bytes,
    simulated_size,
    stacked,
    varp_update,
)
from fl_services.shared.core.algorithms.submodel import Shapes, coverage, embed, extract
from fl_services.shared.core.records import Record, RecordSpec
from fl_services.shared.core.training import Proximal


class FedSCAVARParams(ClusterParams, FedRolexParams, FedProxParams):
    """ClusterFedVARP's clusters, FedRolex's capacities and FedProx's μ."""


class FedSCAVAR(ClusterMemory[FedSCAVARParams], FedRolex[FedSCAVARParams]):
    name = "fedscavar"
    multi_edge = False  # the cluster memory spans all clients
    edge_rounds = False
    has_server_lr: ClassVar[bool] = True

    # ---- cloud ---------------------------------------------------------------------------------
    def init_global(self, model: torch.nn.Module) -> Record:
        return with_control(super().init_global(model))

    def contribution_spec(self, global_: Record, clients: list[int]) -> RecordSpec:
        check_client_ids(self.name, clients, simulated_size(self.config))
        w = global_[MODEL]
        return {**deltas_spec(w, clients), CONTROL: {n: (tuple(t.shape), torch.float64) for n, t in w.items()}}

    def server_memory_bytes(self, global_: Record) -> int:
        return memory_bytes(self.memory_groups(), global_[MODEL], lambda _: torch.float64)

    # Its contributions carry no coverage weights (the cloud recomputes the windows): FedRolex's check does not apply.
    check_contribution = Algorithm.check_contribution

    def cloud_update(
        self, global_: Record, contributions: list[base.Contribution], cloud_state: Record, round: int
    ) -> tuple[Record, Record]:
        groups = self.memory_groups(cloud_state, contributions)
        b = buffered_clients(self.name, contributions, groups, roster.slots(self.config, cloud_state))
        clients = b.ids
        w = global_[MODEL]
        shapes: Shapes = {n: tuple(t.shape) for n, t in w.items()}
        # The windows are a function of (client, round): the cloud recomputes them instead of shipping masks.
        masks = {k: coverage(self.architecture, self.windows(k, round, shapes), shapes) for k in clients}
        step, memory = varp_update(w, cloud_state, b, len(groups), lambda _: torch.float64,
                                   lambda name: torch.stack([masks[k][name] for k in clients]))
        new_w = aggregate.add_scaled(w, step, self.config.server_lr)
        new_c = control_step(global_[CONTROL], combined_mean(contributions, [CONTROL])[CONTROL], len(clients),
                             len(groups))
        return {MODEL: new_w, CONTROL: new_c}, {MEMORY: memory, **self.memory_state(groups)}

    # ---- edge ----------------------------------------------------------------------------------
    def client_task(self, global_: Record, client_id: int, round: int) -> Record:
        task = super().client_task(global_, client_id, round)
        return {**task, CONTROL: extract(global_[CONTROL], self.architecture, self.windows(client_id, round))}

    def edge_aggregate(
        self, results: list[base.ClientResult], edge_state: Record, round: int, edge_id: int | None = None
    ) -> tuple[base.EdgeAggregate, Record]:
        if not results:
            raise ValueError("cannot aggregate an empty set of results")
        deltas, items = [], []
        for r in sorted(results, key=lambda r: r.client_id):
            full_dw, _ = self.embed_result(r.tensors[MODEL], r.client_id, round)
            full_dc, _ = self.embed_result(r.tensors[CONTROL], r.client_id, round)
            deltas.append(full_dw)
            items.append((self.client_weight(r.num_samples), {CONTROL: full_dc}))
        control = aggregate.reduce(items)
        return base.EdgeAggregate({DELTAS: stacked(deltas), **control.sums}, control.weight), edge_state

    # ---- client --------------------------------------------------------------------------------
    def local_update(self, job: base.LocalJob, task: Record, state: Record) -> base.ClientUpdate:
        w, c = task[MODEL], task[CONTROL]
        # The run's full-width model gives the shapes c_k is kept at.
        full = {n: p.detach() for n, p in job.model_factory().named_parameters()}
        full_shapes: Shapes = {n: tuple(p.shape) for n, p in full.items()}
        windows = self.windows(job.client_id, job.round, full_shapes)
        c_k_full = kept_control(state, full)
        c_k = extract(c_k_full, self.architecture, windows)
        if any(tuple(c_k[n].shape) != tuple(t.shape) for n, t in w.items()):
            raise ValueError(f"task for client {job.client_id} in round {job.round} does not match its window")
        model = self.sub_model(job, w)
        mu = self.params.mu
        centre = {n: t.detach().clone() for n, t in w.items()}  # not aliasing the tensors trained in place
        u = corrected_sgd(job, self.config.local, model, w, c, c_k, proximal=Proximal(centre, mu) if mu > 0 else None)
        placed, covered = embed(u.control, self.architecture, windows, full_shapes)
        new_state = {n: torch.where(covered[n], placed[n], c_k_full[n]).contiguous() for n in w}
        return base.ClientUpdate({MODEL: u.delta_w, CONTROL: u.delta_c}, len(job.data.train), u.stats.mean_loss,
                            {CONTROL: new_state})
