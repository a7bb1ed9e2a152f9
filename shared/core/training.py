"""Local optimisation and evaluation, shared by every algorithm's client side and by the cloud."""
from __future__ import annotations

import threading
import warnings
import weakref
from collections.abc import Iterable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from fl_services.shared.core.config import LocalTrainingConfig
from fl_services.shared.core.data import ArrayDataset
from fl_services.shared.core.dvfs import before_epoch
from fl_services.shared.core.tensors import Tensors
from fl_services.shared.runtime.extras import optional


@dataclass(frozen=True)
class Proximal:
    """The term μ/2 Σ_params ‖p − centre[p]‖² of the local objective (FedProx's), applied as its gradient
    μ(p − centre[p]), added to each parameter's gradient after backward: the same sum autograd forms for the term
    in the loss (2(p − c)·μ/2 is (p − c)·μ exactly), without its nodes, which cost a third of a logistic
    regression's step. The reported loss never included it. `centre` must not alias the trained parameters."""

    centre: Tensors
    mu: float

    def add_gradient(self, named: dict[str, nn.Parameter]) -> None:
        with torch.no_grad():
            pull = torch._foreach_sub(list(named.values()), [self.centre[name] for name in named])
            torch._foreach_mul_(pull, self.mu)
            torch._foreach_add_([grad_of(p) for p in named.values()], pull)


@dataclass(frozen=True)
class DpSgd:
    """DP-SGD (Abadi et al., CCS 2016) through opacus: every example's gradient clipped to L2 norm `clip_norm`,
    Gaussian noise of std `noise_multiplier`·`clip_norm` added to each minibatch's sum of them."""

    noise_multiplier: float
    clip_norm: float


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


def make_optimizer(params: Iterable[nn.Parameter], cfg: LocalTrainingConfig) -> torch.optim.Optimizer:
    # A fresh optimiser per round is what resets the Nesterov momentum buffer each round.
    if cfg.optimizer == "nesterov":
        return torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum, nesterov=True)
    return torch.optim.SGD(params, lr=cfg.lr)


# The optimiser of each model object that trained, for a model handed out again (a client process keeps its
# models across tasks, client/models.py): its state cleared rather than the optimiser built again.
_optimizers: weakref.WeakKeyDictionary[nn.Module, tuple[tuple[object, ...], torch.optim.Optimizer]] = (
    weakref.WeakKeyDictionary())
_optimizers_lock = threading.Lock()  # the reference runner trains on several threads, each its own models


def optimizer_for(model: nn.Module, named: dict[str, nn.Parameter], cfg: LocalTrainingConfig) -> torch.optim.Optimizer:
    """`make_optimizer` over `named`, with no state: the one this model last trained with, its state cleared,
    where it was built over the same parameters with the same settings. SGD's only state is the momentum
    buffer, created at the first step: a cleared optimiser steps exactly as a fresh one."""
    key = (cfg.optimizer, cfg.lr, cfg.momentum, tuple(map(id, named.values())))
    with _optimizers_lock:
        kept = _optimizers.get(model)
        if kept is not None and kept[0] == key:
            kept[1].state.clear()
            return kept[1]
        opt = make_optimizer(named.values(), cfg)
        _optimizers[model] = (key, opt)
        return opt


def local_sgd(
    model: nn.Module,
    data: ArrayDataset,
    cfg: LocalTrainingConfig,
    generator: torch.Generator,
    *,
    proximal: Proximal | None = None,
    correction: Tensors | None = None,
    dp_sgd: DpSgd | None = None,
) -> LocalStats:
    """E epochs of minibatch SGD (or Nesterov) on `data`, in place on `model`; with `dp_sgd`, private SGD (its
    noise drawn from `generator`, after the batch order: the same seed gives the same model). Each gradient gets
    the `proximal` term's, then `correction` (SCAFFOLD's c − c_k) added."""
    model.train()
    named = dict(model.named_parameters())
    # DP-SGD wraps the optimiser (opacus's DPOptimizer): built fresh, never kept.
    opt = make_optimizer(named.values(), cfg) if dp_sgd is not None else optimizer_for(model, named, cfg)
    forward: nn.Module = model
    if dp_sgd is not None:
        if proximal is not None or correction is not None:
            # opacus replaces each gradient by the noised sum of per-example ones: a term added to the gradient
            # would be dropped.
            raise ValueError("DP-SGD takes neither a proximal term nor a gradient correction")
        forward, opt = _private(model, opt, dp_sgd, len(data), cfg.batch_size, generator)
    try:
        steps, loss_sum = _epochs(forward, named, opt, data, cfg, generator, proximal, correction)
    finally:
        if forward is not model:
            forward._close()  # type: ignore[operator]  # opacus's hooks off the model
    return LocalStats(steps, loss_sum / max(steps, 1))


def _private(model: nn.Module, opt: torch.optim.Optimizer, dp_sgd: DpSgd, n: int, batch_size: int,
             generator: torch.Generator) -> tuple[nn.Module, torch.optim.Optimizer]:
    # Imported here: opacus takes seconds to import, and only runs with DP-SGD need it (an extra).
    GradSampleModule = optional("opacus", "dp", "DP-SGD (privacy.dp_sgd_noise_multiplier)").GradSampleModule
    DPOptimizer = optional("opacus.optimizers", "dp", "DP-SGD (privacy.dp_sgd_noise_multiplier)").DPOptimizer

    # opacus's hooks fire on the first layer although the inputs need no gradient, as they never do here.
    warnings.filterwarnings("ignore", message="Full backward hook is firing when gradients are computed with "
                            "respect to module outputs", category=UserWarning)

    expected = batch_size if 0 < batch_size < n else n  # a mean loss over the batch: its sum / expected
    return GradSampleModule(model), DPOptimizer(opt, noise_multiplier=dp_sgd.noise_multiplier,
                                                max_grad_norm=dp_sgd.clip_norm, expected_batch_size=expected,
                                                generator=_noise_generator(generator, device_of(model)))


def _noise_generator(generator: torch.Generator, device: torch.device) -> torch.Generator:
    """Where DP-SGD draws its noise: `generator` itself on the CPU. opacus draws the noise where the gradients
    are, which takes a generator of that device: on a GPU, one seeded as `generator` was, so that the batch
    order still comes from `generator` alone (the noise then differs from a CPU run's, as CUDA's arithmetic does)."""
    if device == generator.device:
        return generator
    return torch.Generator(device=device).manual_seed(generator.initial_seed())


def device_of(model: nn.Module) -> torch.device:
    """Where `model`'s parameters are (the CPU for a model without any)."""
    return next((p.device for p in model.parameters()), torch.device("cpu"))


def _epochs(model: nn.Module, named: dict[str, nn.Parameter], opt: torch.optim.Optimizer, data: ArrayDataset,
            cfg: LocalTrainingConfig, generator: torch.Generator, proximal: Proximal | None,
            correction: Tensors | None) -> tuple[int, float]:
    steps, loss_sum = 0, 0.0
    for epoch in range(cfg.epochs):
        before_epoch(epoch)  # DVFS: the client picks its frequency (a no-op outside a client process)
        for idx in batches(len(data), cfg.batch_size, generator):
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(data.x[idx]), data.y[idx])
            loss_sum += loss.item()
            loss.backward()
            if proximal is not None:
                proximal.add_gradient(named)
            if correction is not None:
                torch._foreach_add_([grad_of(p) for p in named.values()], [correction[name] for name in named])
            opt.step()
            steps += 1
    return steps, loss_sum


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


# Evaluation batches: on the CPU, small enough that a conv layer's activations stay in the cache (the CNNs
# evaluate 1.6-2.2x faster in batches of 128 than of 1024 on one thread); an accelerator takes large ones.
CPU_EVALUATION_BATCH = 128
ACCELERATOR_EVALUATION_BATCH = 1024


@torch.no_grad()
def evaluate(model: nn.Module, data: ArrayDataset, batch_size: int | None = None) -> Evaluation:
    model.eval()
    device = device_of(model)  # each batch goes where the model is (shared/core/device.py)
    if batch_size is None:
        batch_size = CPU_EVALUATION_BATCH if device.type == "cpu" else ACCELERATOR_EVALUATION_BATCH
    loss_sum, correct = 0.0, 0
    for start in range(0, len(data), batch_size):
        x, y = data.x[start : start + batch_size].to(device), data.y[start : start + batch_size].to(device)
        logits = model(x)
        loss_sum += float(F.cross_entropy(logits, y, reduction="sum"))
        correct += int((logits.argmax(1) == y).sum())
    n = max(len(data), 1)
    return Evaluation(loss_sum / n, correct / n, len(data))
