"""Buffered asynchronous averaging (FedBuff, Nguyen et al., AISTATS 2022) at the cloud: staleness weights.

With a buffer of B < L edge contributions, an edge's contribution computed on global version v may be consumed
by the update of version t > v. Its step then counts s(τ) times, τ = t − v (RunConfig.topology.staleness):

    w ← w + η_s · Σ_l s(τ_l) S_l / Σ_l W_l

where S_l is the edge's weighted sum of its clients' steps and W_l their total weight, the FedBuff rule with
the weights p_k of FedAvg. The denominator keeps the raw weights: a stale contribution shrinks the step
rather than only shifting it towards the fresh ones, as in FedBuff, where the buffer's mean is divided by its
size, not by the staleness weights. One staler than `max` is dropped (its record says so). With τ = 0
everywhere (B = L), every s is 1 and the contributions are used as they came: the synchronous rule, bit for bit.
"""
from __future__ import annotations

import math
from dataclasses import replace

from fl_services.shared.core.algorithms.base import Contribution
from fl_services.shared.core.config import StalenessConfig


def fedbuff(staleness: int) -> float:
    """FedBuff's s(τ) = 1/√(1 + τ)."""
    return 1.0 / math.sqrt(1.0 + staleness)


def weight(config: StalenessConfig, staleness: int) -> float | None:
    """s(τ) for a contribution `staleness` versions old; None where it is dropped (staler than config.max)."""
    if staleness < 0:
        raise ValueError(f"a contribution cannot be computed on a version newer than the update's ({staleness})")
    if config.max is not None and staleness > config.max:
        return None
    if staleness == 0 or config.function == "constant":
        return 1.0
    if config.function == "fedbuff":
        return fedbuff(staleness)
    return (1.0 + staleness) ** -(0.5 if config.exponent is None else config.exponent)


def weights(config: StalenessConfig, contributions: list[Contribution], version: int) -> tuple[float | None, ...]:
    """Each contribution's s(t − v) in the update of `version` (None: dropped)."""
    return tuple(weight(config, version - c.base_version) for c in contributions)


def weighted(contributions: list[Contribution], scales: tuple[float | None, ...]) -> list[Contribution]:
    """The contributions that count, each sum scaled by its s and its weight left as it is (see above); one whose
    s is 1 is passed on untouched."""
    return [c if s == 1.0 else replace(c, tensors={g: {name: t * s for name, t in ts.items()}
                                                   for g, ts in c.tensors.items()})
            for c, s in zip(contributions, scales, strict=True) if s is not None]
