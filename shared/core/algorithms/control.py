"""SCAFFOLD's control variates (Karimireddy et al., ICML 2020, option II), the piece SCAFFOLD and FedSCAVAR
share: the server control c as the global state's "control" group beside "model" (c⁰ = 0), the client's
c_k in its own state's "control" group (c_k⁰ = 0), the corrected local steps and the new controls

    w_k ← w_k − η_k (∇ℓ(w_k; b) − c_k + c),   c_k⁺ = c_k − c + (w − w_k)/L,   Δc_k = c_k⁺ − c_k,

and the server's c ← c + (m/N) Σ p_k Δc_k. L is K·η_k for plain SGD; with Nesterov it is the
effective step length (`step_length`; scaffold.py says why).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from fl_services.shared.core.algorithms import aggregate
from fl_services.shared.core.algorithms.base import MODEL, LocalJob
from fl_services.shared.core.config import LocalTrainingConfig
from fl_services.shared.core.records import Record
from fl_services.shared.core.tensors import Tensors
from fl_services.shared.core.training import LocalStats, Proximal, local_sgd, parameters_of

CONTROL = "control"


def with_control(global_: Record) -> Record:
    """The global state with c⁰ = 0 beside the model."""
    return {**global_, CONTROL: {n: torch.zeros_like(t) for n, t in global_[MODEL].items()}}


def kept_control(state: Record, like: Tensors) -> Tensors:
    """The client's c_k from its state's "control" group; c_k⁰ = 0, shaped like `like`, where it holds none."""
    kept = state.get(CONTROL, {})
    return {n: kept[n] if n in kept else torch.zeros_like(t) for n, t in like.items()}


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


@dataclass(frozen=True)
class CorrectedUpdate:
    stats: LocalStats
    delta_w: Tensors  # Δw_k = w_k − w
    control: Tensors  # c_k⁺
    delta_c: Tensors  # Δc_k


def corrected_sgd(job: LocalJob, cfg: LocalTrainingConfig, model: nn.Module, w: Tensors, c: Tensors, c_k: Tensors,
                  proximal: Proximal | None = None) -> CorrectedUpdate:
    """Local SGD from `model` (holding w) with every gradient corrected by c − c_k, and the new controls."""
    stats = local_sgd(model, job.data.train, cfg, job.generator, proximal=proximal,
                      correction={n: (c[n] - c_k[n]).to(w[n].dtype) for n in w})
    w_k = parameters_of(model)
    c_plus, delta_c = client_controls(c, c_k, w, w_k, step_length(cfg, stats.steps))
    return CorrectedUpdate(stats, {n: (w_k[n] - w[n]).contiguous() for n in w}, c_plus, delta_c)


def control_step(c: Tensors, mean_delta: Tensors, participants: int, num_clients: int) -> Tensors:
    """c ← c + (m/N) Σ_{k∈S} p_k Δc_k, given the p-weighted mean of the Δc_k."""
    return aggregate.add_scaled(c, mean_delta, participants / num_clients)
