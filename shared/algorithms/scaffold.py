"""SCAFFOLD (Karimireddy et al., ICML 2020), option II control variates, as issue 3 writes it.

State: the global state holds the model w and the server control c as "control.<param>" tensors
(c⁰ = 0); client k keeps c_k (c_k⁰ = 0) in its own state under the same "control.<param>" names.

Client, sent (w, c): starting from w_k = w, K = E·|𝓑| steps (K counts the steps actually taken)
    w_k ← w_k − η_k (∇ℓ(w_k; b) − c_k + c)
then
    c_k⁺ = c_k − c + (w − w_k) / (K·η_k),   Δw_k = w_k − w,   Δc_k = c_k⁺ − c_k,   c_k ← c_k⁺.
It sends Δw_k under the parameter names and Δc_k under "control.<param>".
Server: w ← w + η_s Σ_{k∈S} p_k Δw_k;   c ← c + (m/N) Σ_{k∈S} p_k Δc_k,
with p_k as in FedAvg (data-size weights over S, or 1/m), m the number of clients selected in the
round (max(⌊λN⌋, 1) with one edge) and N = data.num_clients.

Several edges: c is one global tensor and both Σ p_k Δw_k and Σ p_k Δc_k are associative partial
sums, so edges send partials of both and the cloud's update equals the flat rule over all of S;
multi_edge is therefore allowed. m is then the total selected over all edges, Σ_l max(⌊λ·N_l⌋, 1),
which is what the edges' `select` draws. κ > 1 edge rounds are not defined by the rule and refused.

Differences from the paper: the paper's server step for c is c ← c + (1/N) Σ_{k∈S} Δc_k; the
issue's (m/N) Σ p_k Δc_k equals it for p_k = 1/m (weighting="uniform") and weights Δc_k by data size
for option 1 (weighting="samples", the default). As in the paper, η_s scales only the step for w.

Nesterov (local.optimizer = "nesterov"): the correction c − c_k is added to the minibatch gradient
before the optimiser step, so torch's SGD(nesterov=True) puts the corrected gradient through its
momentum buffer (a fresh buffer each round). Under a constant gradient g, K such steps move the weights
by L·g with L = η_k Σ_{t=1..K} (1 + β(1 − β^t)/(1 − β)) ≈ K·η_k/(1 − β), not K·η_k. Dividing by K·η_k
would give c_k⁺ ≈ s·ḡ + (s − 1)(c − c_k) with s = L/(K·η_k) and ḡ the mean minibatch gradient, so the correction
c − c_k would be multiplied by about −(s − 1) every round, with s ≈ 10 at β = 0.9: the controls
diverge (measured: |c| ≈ 5e12 after 20 rounds on digits, Dirichlet(0.3), E = 2). With Nesterov the
denominator is therefore L, which makes c_k⁺ = ḡ again; for plain SGD L = K·η_k, the issue's rule.
"""
from __future__ import annotations

import torch

from shared.algorithms import aggregate
from shared.algorithms.base import Algorithm, ClientUpdate, Contribution, LocalJob, combined_mean
from shared.config import LocalTrainingConfig, RunConfig
from shared.selection import num_selected
from shared.training import load_parameters, local_sgd, parameters_of
from shared.transport.tensors import Tensors

CONTROL = "control."


def control_name(param: str) -> str:
    return CONTROL + param


def split_state(global_: Tensors) -> tuple[Tensors, Tensors]:
    """(model w, control c) with c keyed by parameter name."""
    model = {n: t for n, t in global_.items() if not n.startswith(CONTROL)}
    control = {n[len(CONTROL):]: t for n, t in global_.items() if n.startswith(CONTROL)}
    return model, control


def step_length(cfg: LocalTrainingConfig, steps: int) -> float:
    """How far `steps` optimiser steps move the weights per unit of a constant gradient.

    Plain SGD: K·η. torch Nesterov (buffer b_1 = g, b_t = β b_{t−1} + g, step η(g + β b_t)):
    η Σ_{t=1..K} (1 + β(1 − β^t)/(1 − β)) = η (K + β/(1 − β) · (K − β(1 − β^K)/(1 − β))).
    """
    beta = cfg.momentum if cfg.optimizer == "nesterov" else 0.0
    if beta == 0.0:
        return steps * cfg.lr
    geometric = beta * (1 - beta**steps) / (1 - beta)  # Σ_{t=1..K} β^t
    return cfg.lr * (steps + beta / (1 - beta) * (steps - geometric))


def client_controls(c: Tensors, c_k: Tensors, w: Tensors, w_k: Tensors, length: float) -> tuple[Tensors, Tensors]:
    """(c_k⁺, Δc_k) with c_k⁺ = c_k − c + (w − w_k)/length, computed in float64, returned in float32."""
    new, delta = {}, {}
    for name in w:
        ck = c_k[name].to(torch.float64)
        plus = ck - c[name].to(torch.float64) + (w[name].to(torch.float64) - w_k[name].to(torch.float64)) / length
        new[name] = plus.to(torch.float32).contiguous()
        delta[name] = (plus - ck).to(torch.float32).contiguous()
    return new, delta


class Scaffold(Algorithm):
    name = "scaffold"
    multi_edge = True
    edge_rounds = False

    def __init__(self, config: RunConfig):
        super().__init__(config)
        # m: how many clients the edges' `select` draws in total each round.
        self.num_selected = sum(
            num_selected(config.fraction, len(config.clients_of_edge(e))) for e in range(config.topology.num_edges)
        )

    # ---- cloud ---------------------------------------------------------------------------------
    def init_global(self, model: torch.nn.Module) -> Tensors:
        w = super().init_global(model)
        return {**w, **{control_name(n): torch.zeros_like(t) for n, t in w.items()}}

    def model_parameters(self, global_: Tensors) -> Tensors:
        return split_state(global_)[0]

    def cloud_update(
        self, global_: Tensors, contributions: list[Contribution], cloud_state: Tensors, round: int
    ) -> tuple[Tensors, Tensors]:
        mean = combined_mean(contributions)
        w_step = {n: t for n, t in mean.items() if not n.startswith(CONTROL)}
        c_step = {n: t for n, t in mean.items() if n.startswith(CONTROL)}
        scale = self.num_selected / self.config.data.num_clients
        new = aggregate.add_scaled(global_, w_step, self.config.server_lr)
        return aggregate.add_scaled(new, c_step, scale), cloud_state

    # ---- client --------------------------------------------------------------------------------
    def local_update(self, job: LocalJob, task: Tensors, state: Tensors) -> ClientUpdate:
        w, c = split_state(task)
        c_k = {n: state[control_name(n)] if control_name(n) in state else torch.zeros_like(t) for n, t in w.items()}
        model = load_parameters(job.model_factory(), w)
        correction = {n: (c[n] - c_k[n]).to(w[n].dtype) for n in w}
        cfg = self.config.local
        stats = local_sgd(model, job.data.train, cfg, job.generator, correction=correction)
        w_k = parameters_of(model)
        c_plus, delta_c = client_controls(c, c_k, w, w_k, step_length(cfg, stats.steps))
        tensors = {n: (w_k[n] - w[n]).contiguous() for n in w}
        tensors.update({control_name(n): delta_c[n] for n in w})
        return ClientUpdate(
            tensors, len(job.data.train), stats.mean_loss, {control_name(n): t for n, t in c_plus.items()}
        )
