"""SCAFFOLD (Karimireddy et al., ICML 2020), option II control variates, as the seed specification writes it.

State: the global state holds the model w ("model" group) and the server control c ("control" group,
c⁰ = 0); client k keeps c_k (c_k⁰ = 0) in its own state's "control" group (shared/core/algorithms/control.py).

Client, sent (w, c): starting from w_k = w, K = E·|𝓑| steps (K counts the steps actually taken)
    w_k ← w_k − η_k (∇ℓ(w_k; b) − c_k + c)
then
    c_k⁺ = c_k − c + (w − w_k) / (K·η_k),   Δw_k = w_k − w,   Δc_k = c_k⁺ − c_k,   c_k ← c_k⁺.
It sends Δw_k as its "model" group and Δc_k as its "control" group.
Server: w ← w + η_s Σ_{k∈S} p_k Δw_k;   c ← c + (m/N) Σ_{k∈S} p_k Δc_k,
with p_k as in FedAvg (data-size weights over S, or 1/m), m the number of clients selected in the
round (max(⌊λN⌋, 1) with one edge) and N the run's devices (shared/core/roster.py): data.num_clients in a
simulated run; in a run over registered devices, those its edges declared as members so far. A device that joins
counts in N (and its edge's m) from the round whose contribution first declares it; its c_k starts at 0 on the
device, as every client's did, and the server keeps no memory of it (docs/decisions/memories-keyed-by-device.md).

Several edges: c is one global tensor and both Σ p_k Δw_k and Σ p_k Δc_k are associative partial
sums, so edges send partials of both and the cloud's update equals the flat rule over all of S;
multi_edge is therefore allowed. m is then the total selected over all edges, Σ_l max(⌊λ·N_l⌋, 1) over each
edge's members N_l in the round, which is what the edges' `select` draws. κ > 1 edge rounds are not defined
by the rule and refused.

Differences from the paper: the paper's server step for c is c ← c + (1/N) Σ_{k∈S} Δc_k; the
specification's (m/N) Σ p_k Δc_k equals it for p_k = 1/m (weighting="uniform") and weights Δc_k by data size
for option 1 (weighting="samples", the default). As in the paper, η_s scales only the step for w.

Nesterov (local.optimizer = "nesterov"): the correction c − c_k is added to the minibatch gradient
before the optimiser step, so torch's SGD(nesterov=True) puts the corrected gradient through its
momentum buffer (a fresh buffer each round). Under a constant gradient g, K such steps move the weights
by L·g with L = η_k Σ_{t=1..K} (1 + β(1 − β^t)/(1 − β)) ≈ K·η_k/(1 − β), not K·η_k. Dividing by K·η_k
would give c_k⁺ ≈ s·ḡ + (s − 1)(c − c_k) with s = L/(K·η_k) and ḡ the mean minibatch gradient, so the correction
c − c_k would be multiplied by about −(s − 1) every round, with s ≈ 10 at β = 0.9: the controls
diverge (measured: |c| ≈ 5e12 after 20 rounds on digits, Dirichlet(0.3), E = 2). With Nesterov the
denominator is therefore L, which makes c_k⁺ = ḡ again; for plain SGD L = K·η_k, the specification's rule.
"""
from __future__ import annotations

import torch

from fl_services.shared.core import roster
from fl_services.shared.core.algorithms import aggregate
from fl_services.shared.core.algorithms.base import (
    MODEL,
    Algorithm,
    ClientUpdate,
    Contribution,
    LocalJob,
    NoParams,
    combined_mean,
)
from fl_services.shared.core.algorithms.control import CONTROL, control_step, corrected_sgd, kept_control, with_control
from fl_services.shared.core.records import Record
from fl_services.shared.core.training import load_parameters


class Scaffold(Algorithm[NoParams]):
    name = "scaffold"
    multi_edge = True
    edge_rounds = False
    stale_refusal = ("SCAFFOLD's server control variate c moves by the clients' Δc_k, each computed against the c "
                     "of the version its client was sent: a stale Δc_k applied to a newer c breaks c = mean c_k, "
                     "and no staleness weight restores it")

    # ---- cloud ---------------------------------------------------------------------------------
    def init_global(self, model: torch.nn.Module) -> Record:
        return with_control(super().init_global(model))

    def cloud_update(
        self, global_: Record, contributions: list[Contribution], cloud_state: Record, round: int
    ) -> tuple[Record, Record]:
        mean = combined_mean(contributions)
        w = aggregate.add_scaled(global_[MODEL], mean[MODEL], self.config.server_lr)
        # m: how many clients the edges' `select` drew in total; N: the run's devices.
        c = control_step(global_[CONTROL], mean[CONTROL], roster.selected_count(self.config, contributions),
                         len(roster.devices(self.config, cloud_state)))
        return {MODEL: w, CONTROL: c}, cloud_state

    # ---- client --------------------------------------------------------------------------------
    def local_update(self, job: LocalJob, task: Record, state: Record) -> ClientUpdate:
        w, c = task[MODEL], task[CONTROL]
        c_k = kept_control(state, w)
        u = corrected_sgd(job, self.config.local, load_parameters(job.model_factory(), w), w, c, c_k)
        return ClientUpdate({MODEL: u.delta_w, CONTROL: u.delta_c}, len(job.data.train), u.stats.mean_loss,
                            {CONTROL: u.control})
