"""FedProx (Li et al., MLSys 2020).

Client: E epochs of minibatch SGD (batch B, lr η_k; Nesterov selectable) on the proximal objective
    ℓ(w_k; b) + μ/2 ‖w_k − w‖²,
summed over every model parameter, where w is the model the client was sent; it returns Δw_k = w_k − w.
Server: as FedAvg, w ← w + η_s Σ_{k∈S} p_k Δw_k, including several edges and κ > 1 edge rounds (the
proximal centre is then the model the edge sent, i.e. the edge's model in that edge round).

Differences from the paper, as the specification asks: every client runs exactly E epochs (the paper's
γ-inexact solvers and dropped stragglers are not modelled), and μ is one run-wide value (the notes'
μ_k per client is not used). The reported training loss is ℓ alone, without the proximal term, so it
compares directly with FedAvg's. With μ = 0 the client is FedAvg's, bit for bit.
"""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from fl_services.shared.core.algorithms.fedavg import FedAvg
from fl_services.shared.core.numbers import Float
from fl_services.shared.core.tensors import Tensors
from fl_services.shared.core.training import Proximal


class FedProxParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    mu: Float = Field(0.01, ge=0, description="μ: weight of the proximal term μ/2 ‖w_k − w‖²")


class FedProx(FedAvg[FedProxParams]):
    name = "fedprox"

    def proximal(self, global_: Tensors) -> Proximal | None:
        mu = self.params.mu
        if mu == 0:
            return None
        # The centre must not alias the tensors the model trains in place.
        return Proximal({name: t.detach().clone() for name, t in global_.items()}, mu)
