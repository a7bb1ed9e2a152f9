"""pFedMe (T. Dinh, N. Tran, T. Nguyen, "Personalized Federated Learning with Moreau Envelopes", NeurIPS 2020).

Notation: θ the global model, N an edge's clients, λ_part = config.fraction; Params: R = local_rounds,
K = inner_steps, η_p = personal_lr, λ = lam, β = beta; η = config.local.lr.

Client k (every client, every round), starting from ω = θ_k = θ:
    for r = 0..R−1:  draw a batch b_r (batch size config.local.batch_size, 0 = full batch; batches are
                     successive shuffled epochs of the client's train split, drawn from job.generator)
                     K times: θ_k ← θ_k − η_p (∇ℓ(θ_k; b_r) + λ(θ_k − ω))
                     ω ← ω − η·λ·(ω − θ_k)
    keeps θ_k (its personalised model, client state) and returns ω itself (not ω − θ).
    It also reports θ_k's loss and accuracy on its own held-out split (`personal_loss`,
    `personal_accuracy`); the round history averages them over the clients of S (weighted by training
    samples), so the personalised accuracy of round r is that of θ_k after round r's local training.
Edge: S is a uniform sample of m = max(⌊λ_part·n⌋, 1) of the n clients whose ω arrived, drawn with
    fl_services.shared.core.selection.select_clients(config, answered, round, edge) — the same (seed, SELECTION, round,
    edge) stream plain selection would use, free here because `select` takes everyone without drawing.
    The edge sends Σ_{k∈S} ω_k (summed in float64, sent as float32) with weight |S|, on behalf of S: the
    history lists the clients of S, as every algorithm's lists the clients whose updates entered the model.
Cloud: θ ← (1 − β)·θ + β · (Σ_l Σ_{k∈S_l} ω_k) / (Σ_l |S_l|), applied once over all edges' partials.

Deviations from the paper and its code, all following the seed specification:
- The inner problem is solved by exactly K gradient steps of step η_p (the paper leaves the
  proximal solver open; its code uses K steps too). θ_k restarts from the global model every round, as in
  the authors' code, so the kept θ_k is only the personalised model to evaluate, never a warm start.
- Several edges are allowed: each samples its own S_l, so S = ∪ S_l is a sample stratified by edge
  rather than one uniform draw over all N clients; with one edge it is exactly the paper's rule.
- With config.local.optimizer = "nesterov" the K inner steps use torch's SGD(nesterov=True) on θ_k with
  lr η_p and config.local.momentum, its buffer reset every global round (the specification's Nesterov option).
- p_k is always 1/|S| (config.weighting is not used), local.epochs is replaced by R, and server_lr must
  stay 1 because β is the server step.
"""
from __future__ import annotations

import math
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field

from fl_services.shared.core.algorithms import aggregate, base
from fl_services.shared.core.algorithms.base import MODEL, Algorithm, combined_mean
from fl_services.shared.core.config import RunConfig
from fl_services.shared.core.data import ArrayDataset
from fl_services.shared.core.numbers import Float, Int
from fl_services.shared.core.records import Record
from fl_services.shared.core.selection import select_clients
from fl_services.shared.core.tensors import Tensors
from fl_services.shared.core.training import Sgd, batches, evaluate, grad_of, load_parameters, parameters_of

PERSONAL = "personal"  # the client state's group holding θ_k


class PFedMeParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    # The authors' MNIST settings (R = 20, K = 5, λ = 15, β = 1) except η_p: their 0.09 makes θ_k oscillate
    # on this project's standardised inputs (2NN on MNIST: one class predicted per client), 0.03 does not.
    local_rounds: Int = Field(20, ge=1, le=100_000, description="R: local rounds (one batch each)")
    inner_steps: Int = Field(5, ge=1, le=10_000, description="K: gradient steps on the inner problem")
    personal_lr: Float = Field(0.03, gt=0, description="η_p: step size of the inner steps")
    lam: Float = Field(15.0, gt=0, description="λ: strength of the pull between θ_k and ω")
    beta: Float = Field(1.0, gt=0, description="β: server mixing; 1 replaces θ by the mean ω")


def mix(global_: Tensors, mean_omega: Tensors, beta: float) -> Tensors:
    """(1 − β)·θ + β·mean ω, in float64, returned in θ's dtypes."""
    return {
        name: ((1.0 - beta) * t.to(torch.float64) + beta * mean_omega[name].to(torch.float64)).to(t.dtype)
        for name, t in global_.items()
    }


def batch_stream(n: int, batch_size: int, generator: torch.Generator) -> Iterator[torch.Tensor]:
    """Endless minibatches: shuffled epochs one after another, so R may exceed the batches per epoch."""
    while True:
        yield from batches(n, batch_size, generator)


class PFedMe(Algorithm[PFedMeParams]):
    name = "pfedme"
    stale_refusal = ("pFedMe's server moves θ by β towards the mean of the clients' ω_k, points computed from the "
                     "θ each was sent, not steps: a stale ω_k pulls θ back towards an older model, and a weight "
                     "cannot tell how far")

    @classmethod
    def check_config(cls, config: RunConfig) -> None:
        super().check_config(config)
        if config.server_lr != 1.0:
            raise ValueError("pfedme's server step is params.beta; leave server_lr at 1")

    # ---- edge ----------------------------------------------------------------------------------
    def select(self, client_ids: list[int], round: int, edge_id: int) -> list[int]:
        # Every client trains every round: its personalised model must follow the global one.
        return sorted(client_ids)

    def edge_of(self, client_id: int) -> int:
        """The inverse of RunConfig.clients_of_edge (round-robin): a simulated client's edge, where edge_aggregate
        is not told its edge."""
        if not 0 <= client_id < self.config.data.num_clients:
            raise ValueError(f"client {client_id} belongs to no edge of this run")
        return client_id % self.config.topology.num_edges

    def sampled(self, answered: list[int], round: int, edge_id: int | None = None) -> list[int]:
        """S for this edge and round: a uniform sample of the clients that answered."""
        if edge_id is not None:
            return select_clients(self.config, answered, round, edge_id)
        edges = {self.edge_of(k) for k in answered}
        if len(edges) != 1:
            raise ValueError(f"results from several edges {sorted(edges)} in one edge aggregate")
        return select_clients(self.config, answered, round, edges.pop())

    def client_weight(self, num_samples: int) -> float:
        return 1.0  # θ mixes the plain mean of the ω_k over S

    def edge_aggregate(
        self, results: list[base.ClientResult], edge_state: Record, round: int, edge_id: int | None = None
    ) -> tuple[base.EdgeAggregate, Record]:
        chosen = set(self.sampled([r.client_id for r in results], round, edge_id))
        ordered = sorted((r for r in results if r.client_id in chosen), key=lambda r: r.client_id)
        partial = aggregate.reduce((self.client_weight(r.num_samples), r.tensors) for r in ordered)
        return base.EdgeAggregate(partial.sums, partial.weight, tuple(r.client_id for r in ordered)), edge_state

    # ---- cloud ---------------------------------------------------------------------------------
    def cloud_update(
        self, global_: Record, contributions: list[base.Contribution], cloud_state: Record, round: int
    ) -> tuple[Record, Record]:
        return {MODEL: mix(global_[MODEL], combined_mean(contributions)[MODEL], self.params.beta)}, cloud_state

    # ---- client --------------------------------------------------------------------------------
    def local_update(self, job: base.LocalJob, task: Record, state: Record) -> base.ClientUpdate:
        p = self.params
        model = load_parameters(job.model_factory(), task[MODEL])
        model.train()
        theta = dict(model.named_parameters())
        omega = {name: t.detach().clone() for name, t in task[MODEL].items()}
        # The inner solver's optimiser (plain steps, or Nesterov with its buffer reset here each round).
        opt = Sgd(theta.values(), self.config.local.model_copy(update={"lr": p.personal_lr}))
        train = job.data.train
        stream = batch_stream(len(train), self.config.local.batch_size, job.generator)
        loss_sum = 0.0
        for _ in range(p.local_rounds):
            idx = next(stream)
            x, y = train.x[idx], train.y[idx]
            for _ in range(p.inner_steps):
                opt.zero_grad()
                loss = F.cross_entropy(model(x), y)
                loss_sum += loss.item()
                loss.backward()
                with torch.no_grad():
                    for name, t in theta.items():
                        grad_of(t).add_(t - omega[name], alpha=p.lam)
                opt.step()
            with torch.no_grad():
                for name, t in theta.items():
                    omega[name].sub_(omega[name] - t, alpha=self.config.local.lr * p.lam)
        personal = parameters_of(model)
        return base.ClientUpdate({MODEL: omega}, len(train), loss_sum / (p.local_rounds * p.inner_steps),
                            {PERSONAL: personal}, personal_metrics(model, job.data.test))


def personal_metrics(model: torch.nn.Module, test: ArrayDataset) -> dict[str, float]:
    """θ_k on the client's own held-out split; nothing when it has none (so it is not averaged in as 0)."""
    if len(test) == 0:
        return {}
    result = evaluate(model, test)
    if not math.isfinite(result.loss):
        return {"personal_accuracy": result.accuracy}
    return {"personal_accuracy": result.accuracy, "personal_loss": result.loss}
