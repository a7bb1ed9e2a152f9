"""Client-level differential privacy: DP-FedAvg (McMahan et al., ICLR 2018), as plain functions.

Each client's model step Δ_k is clipped to L2 norm S, and Gaussian noise N(0, σ²S²) is added either to the
sum of an edge's clipped steps (`noise = "edge"`: the cloud and everything downstream see only noised sums)
or to each client's own clipped step before it leaves the device (`noise = "client"`, local DP: the edge
too sees only noised steps). Every client weighs the same (weighting = "uniform"), so one client moves its
edge's sum by at most S: σ is the noise multiplier of a Gaussian mechanism of sensitivity S.

ε at the run's δ after T rounds comes from opacus's RDP accountant for the sampled Gaussian mechanism,
composed over T·κ edge rounds (each noised sum is one release; the κ of a global round are composed, not
hidden by the edge). The sampling rate q is the largest share of an edge's clients selected per round
(edge noise), or 1 for client noise: the edge sees which clients answered, so sampling hides nothing from
it. opacus's analysis assumes Poisson sampling; our edges draw a fixed number without replacement, the
approximation DP-FedAvg's own analysis makes.

Noise is drawn from generators owned by (seed, round, edge) or by the client's training stream, so the
services and the reference runner add the same noise.
"""
from __future__ import annotations

import math
from functools import lru_cache

import torch

from fl_services.shared.core.algorithms import aggregate
from fl_services.shared.core.config import PrivacyConfig, RunConfig
from fl_services.shared.core.data import load_federated
from fl_services.shared.core.records import Record
from fl_services.shared.core.seeding import PRIVACY_NOISE, torch_generator
from fl_services.shared.core.selection import num_selected
from fl_services.shared.core.tensors import MAX_ABS
from fl_services.shared.core.training import DpSgd
from fl_services.shared.runtime.extras import optional

# A noised value this many standard deviations out is never met in practice (1e-15 per coordinate).
NOISE_SIGMAS = 8

# RDP orders searched for the best conversion to (ε, δ): opacus's default set.
ORDERS = tuple([1 + x / 10.0 for x in range(1, 100)] + list(range(12, 64)))


def norm(update: Record) -> float:
    """The L2 norm of the whole record, every tensor of every group as one vector."""
    return math.sqrt(sum(float(t.to(torch.float64).pow(2).sum()) for tensors in update.values()
                         for t in tensors.values()))


def clip(update: Record, bound: float) -> Record:
    """`update` scaled by min(1, S / ‖update‖), in float64."""
    scale = min(1.0, bound / max(norm(update), 1e-300))
    return {group: {name: t.to(torch.float64) * scale for name, t in tensors.items()}
            for group, tensors in update.items()}


def gaussian(like: Record, std: float, generator: torch.Generator) -> Record:
    """N(0, std²) noise shaped like `like` (float64), drawn from `generator` in sorted (group, name) order: a
    record decoded from the wire lists its tensors in another order than the model that made it. Drawn on the CPU
    (`generator`'s device) and placed where `like` is: a client training on a GPU adds the noise a CPU one would."""
    return {group: {name: (torch.randn(like[group][name].shape, generator=generator, dtype=torch.float64) * std)
                    .to(like[group][name].device)
                    for name in sorted(like[group])}
            for group in sorted(like)}


def _plus(a: Record, b: Record) -> Record:
    return {group: {name: t + b[group][name] for name, t in tensors.items()} for group, tensors in a.items()}


def privatised(config: PrivacyConfig, update: Record, generator: torch.Generator) -> Record:
    """A client's own step, clipped and noised (local DP), in the dtypes it came in."""
    clipped = clip(update, config.clip_norm)
    noised = _plus(clipped, gaussian(clipped, config.noise_multiplier * config.clip_norm, generator))
    return {group: {name: t.to(update[group][name].dtype) for name, t in tensors.items()}
            for group, tensors in noised.items()}


def noised_sum(config: RunConfig, updates: list[Record], round: int, edge_id: int) -> Record:
    """Σ_k clip(Δ_k) + N(0, σ²S²) over an edge's client steps (in client id order): the edge's release."""
    privacy = config.privacy
    total = aggregate.reduce((1.0, clip(u, privacy.clip_norm)) for u in updates).sums
    noise = gaussian(total, privacy.noise_multiplier * privacy.clip_norm,
                     torch_generator(config.seed, PRIVACY_NOISE, round, edge_id))
    return _plus(total, noise)


# ---- accounting ------------------------------------------------------------------------------------
def sampling_rate(config: RunConfig) -> float:
    """q: the largest chance that a client is in its edge's round (1 for client noise, see above). A run over
    registered devices takes q = 1, the bound whatever devices register: an edge's members, and so its m/n, are
    known only round by round, and one device alone at an edge is in every round of it."""
    if config.privacy.noise == "client" or config.selection is not None:
        return 1.0
    sizes = {len(config.clients_of_edge(e)) for e in range(config.topology.num_edges)}
    return max(num_selected(config.fraction, n) / n for n in sizes)


def epsilon(config: RunConfig, rounds: int) -> float | None:
    """ε at the run's δ after `rounds` global rounds; None when the run adds no noise."""
    if config.privacy.noise == "off":
        return None
    p = config.privacy
    return _epsilon(sampling_rate(config), p.noise_multiplier, rounds * config.topology.edge_rounds, p.delta)


@lru_cache(maxsize=4096)
def _epsilon(q: float, noise_multiplier: float, steps: int, delta: float) -> float:
    # Imported here: opacus takes seconds to import, and only runs with privacy need it (an extra).
    rdp_analysis = optional("opacus.accountants.analysis.rdp", "dp", "the privacy accountant (ε)")
    compute_rdp, get_privacy_spent = rdp_analysis.compute_rdp, rdp_analysis.get_privacy_spent
    rdp = compute_rdp(q=q, noise_multiplier=noise_multiplier, steps=steps, orders=list(ORDERS))
    eps, _ = get_privacy_spent(orders=list(ORDERS), rdp=rdp, delta=delta)
    return float(eps)


def dp_sgd(config: PrivacyConfig) -> DpSgd | None:
    """What local training adds for DP-SGD, if the run asks for it."""
    if config.dp_sgd_noise_multiplier is None:
        return None
    return DpSgd(config.dp_sgd_noise_multiplier, config.dp_sgd_clip_norm)


def dp_sgd_epsilon(config: RunConfig, rounds: int) -> float | None:
    """DP-SGD's ε at the run's δ after `rounds` global rounds, for the client it protects least, as if every
    client trained in every round (an upper bound with partial participation); None without DP-SGD. Its unit is
    one training example of one client (what a client's updates reveal of an example), where DP-FedAvg's is a
    whole client. Each minibatch step is one sampled Gaussian mechanism with q = B / n_k, over
    rounds · κ · E · ⌈n_k / B⌉ steps (opacus's RDP accountant assumes Poisson batches; ours are a shuffle)."""
    noise = config.privacy.dp_sgd_noise_multiplier
    if noise is None:
        return None
    batch = config.local.batch_size
    worst = 0.0
    sizes = {len(client.train) for client in load_federated(config.data, config.seed).clients}  # memoised
    for n in sorted(sizes):
        per_round = config.local.epochs * math.ceil(n / batch) if 0 < batch < n else config.local.epochs
        q = batch / n if 0 < batch < n else 1.0
        worst = max(worst, _epsilon(q, noise, rounds * config.topology.edge_rounds * per_round,
                                    config.privacy.delta))
    return worst


def rounds_to_run(config: RunConfig) -> int:
    """The rounds the run trains: config.rounds, or fewer when the ε budget is spent before (ε grows with
    every round, so this is the last round whose ε is within the budget; 0 if not even the first is)."""
    budget = config.privacy.epsilon_budget
    if budget is None or config.privacy.noise == "off":
        return config.rounds
    low, high = 0, config.rounds  # ε(low) ≤ budget (ε(0) = 0); find the largest such
    while low < high:
        mid = (low + high + 1) // 2
        eps = epsilon(config, mid)
        if eps is not None and eps <= budget:
            low = mid
        else:
            high = mid - 1
    return low


def check(config: RunConfig) -> None:
    """Raises ValueError for privacy settings a run cannot honour."""
    p = config.privacy
    if p.noise == "off":
        return
    if config.weighting != "uniform":
        raise ValueError("privacy bounds each client's influence by clip_norm only if every client weighs the same: "
                         "set weighting to 'uniform'")
    if p.noise == "edge" and config.aggregation.edge != "mean":
        raise ValueError("privacy.noise 'edge' noises the sum of the clipped client steps: it needs "
                         "aggregation.edge 'mean'")
    std = p.noise_multiplier * p.clip_norm
    if p.clip_norm + NOISE_SIGMAS * std > MAX_ABS:
        # Every noised step (or edge sum) then held values the edges and the cloud refuse: no round could end.
        raise ValueError(f"privacy noise of standard deviation noise_multiplier * clip_norm = {std:g} carries "
                         f"updates beyond the ±{MAX_ABS:g} that edges and the cloud accept: lower them")
    if p.epsilon_budget is not None:  # the budget is looked up with the accountant: its figures must be sound
        check_accounting(config)
        if rounds_to_run(config) == 0:
            raise ValueError(f"privacy.epsilon_budget {p.epsilon_budget} is spent before the first round "
                             f"(epsilon after one round: {epsilon(config, 1):.4g} at delta = {p.delta})")


def check_accounting(config: RunConfig) -> None:
    """Raises ValueError unless each accountant the run uses (DP-FedAvg's, DP-SGD's) gives every round a finite
    ε ≥ 0: each update's record carries them, and one the accountant cannot give failed every update of the run,
    for good. Called where runs are created (cloud/initial_state.py), not by every `check`: it imports opacus,
    seconds that the clients and edges of the run need not spend."""
    for what, spent in (("privacy.noise_multiplier", epsilon), ("privacy.dp_sgd_noise_multiplier", dp_sgd_epsilon)):
        first, last = spent(config, 1), spent(config, config.rounds)
        if first is None or last is None:  # this mechanism is off
            continue
        if not math.isfinite(last):
            raise ValueError(f"{what} is too small to account for: epsilon after {config.rounds} rounds is not a "
                             "finite number")
        if first < 0:  # the conversion from RDP at a δ near 1: a meaningless ε (-2.8 at δ = 1 - 1e-10)
            raise ValueError(f"privacy.delta {config.privacy.delta:g} is too large: epsilon after one round "
                             f"would be {first:.4g}")
