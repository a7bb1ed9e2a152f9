"""Local optimisation and evaluation, shared by every algorithm's client side and by the cloud."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from shared.config import LocalTrainingConfig
from shared.data.datasets import ArrayDataset
from shared.dvfs import before_epoch
from shared.transport.tensors import Tensors

# A regulariser adds to the minibatch loss (FedProx's proximal term); a correction is added to each
# parameter's gradient after backward (SCAFFOLD's c - c_k).
Regulariser = Callable[[nn.Module], torch.Tensor]


@dataclass(frozen=True)
class LocalStats:
    steps: int
    mean_loss: float  # mean minibatch loss over all steps (before each step)


def grad_of(p: torch.Tensor) -> torch.Tensor:
    """p's gradient after backward(): a parameter the loss does not reach has none, which is a model bug."""
    if p.grad is None:
        raise ValueError("a parameter received no gradient: the loss does not depend on it")
    return p.grad


def parameters_of(model: nn.Module) -> Tensors:
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def load_parameters(model: nn.Module, tensors: Tensors) -> nn.Module:
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(tensors[name])
    return model


def batches(n: int, batch_size: int, generator: torch.Generator) -> list[torch.Tensor]:
    """One epoch of minibatch indices; batch size 0 means one full batch (and no shuffle)."""
    if batch_size == 0 or batch_size >= n:
        return [torch.arange(n)]
    return list(torch.randperm(n, generator=generator).split(batch_size))


def make_optimizer(params, cfg: LocalTrainingConfig) -> torch.optim.Optimizer:
    # A fresh optimiser per round is what resets the Nesterov momentum buffer each round.
    if cfg.optimizer == "nesterov":
        return torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum, nesterov=True)
    return torch.optim.SGD(params, lr=cfg.lr)


def local_sgd(
    model: nn.Module,
    data: ArrayDataset,
    cfg: LocalTrainingConfig,
    generator: torch.Generator,
    *,
    regulariser: Regulariser | None = None,
    correction: Tensors | None = None,
) -> LocalStats:
    """E epochs of minibatch SGD (or Nesterov) on `data`, in place on `model`."""
    model.train()
    named = dict(model.named_parameters())
    opt = make_optimizer(named.values(), cfg)
    steps, loss_sum = 0, 0.0
    for epoch in range(cfg.epochs):
        before_epoch(epoch)  # DVFS: the client picks its frequency (a no-op outside a client process)
        for idx in batches(len(data), cfg.batch_size, generator):
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(data.x[idx]), data.y[idx])
            loss_sum += loss.item()
            if regulariser is not None:
                loss = loss + regulariser(model)
            loss.backward()
            if correction is not None:
                for name, p in named.items():
                    grad_of(p).add_(correction[name])
            opt.step()
            steps += 1
    return LocalStats(steps, loss_sum / max(steps, 1))


def full_gradient(model: nn.Module, data: ArrayDataset) -> tuple[Tensors, float]:
    """g_k = grad of the mean loss over all of D_k at the current weights (FedSGD)."""
    model.train()
    model.zero_grad(set_to_none=True)
    loss = F.cross_entropy(model(data.x), data.y)
    loss.backward()
    grads = {name: grad_of(p).detach().clone() for name, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    return grads, loss.item()


@dataclass(frozen=True)
class Evaluation:
    loss: float
    accuracy: float
    samples: int


@torch.no_grad()
def evaluate(model: nn.Module, data: ArrayDataset, batch_size: int = 1024) -> Evaluation:
    model.eval()
    loss_sum, correct = 0.0, 0
    for start in range(0, len(data), batch_size):
        x, y = data.x[start : start + batch_size], data.y[start : start + batch_size]
        logits = model(x)
        loss_sum += float(F.cross_entropy(logits, y, reduction="sum"))
        correct += int((logits.argmax(1) == y).sum())
    n = max(len(data), 1)
    return Evaluation(loss_sum / n, correct / n, len(data))
