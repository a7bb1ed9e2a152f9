"""Local optimisation and evaluation, shared by every algorithm's client side and by the cloud."""
from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn
from torch.optim.optimizer import _default_to_fused_or_foreach
from torch.optim.sgd import sgd

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

    def adder(self, named: dict[str, nn.Parameter]) -> Callable[[], None]:
        """What adds the term's gradient to each of `named`'s, at every step of a local_sgd call."""
        params, centre = list(named.values()), [self.centre[name] for name in named]
        values = [p.detach() for p in params]  # no graph from the pull, without turning autograd off each step

        def add_gradient() -> None:
            pull = torch._foreach_sub(values, centre)
            torch._foreach_mul_(pull, self.mu)
            torch._foreach_add_([grad_of(p) for p in params], pull)

        return add_gradient


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


def minibatches(data: ArrayDataset, batch_size: int,
                generator: torch.Generator) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """One epoch's minibatches of `data` in the order of `batches`: the rows gathered once, each minibatch a
    view of them (two index operations an epoch rather than two a step)."""
    idx = batches(len(data), batch_size, generator)
    order, sizes = torch.cat(idx), [len(i) for i in idx]
    return zip(data.x[order].split(sizes), data.y[order].split(sizes), strict=True)


def sgd_settings(cfg: LocalTrainingConfig) -> tuple[float, float, bool]:
    """The step size, momentum and Nesterov flag of the SGD `cfg` names: momentum only with Nesterov."""
    nesterov = cfg.optimizer == "nesterov"
    return cfg.lr, cfg.momentum if nesterov else 0.0, nesterov


def make_optimizer(params: Iterable[nn.Parameter], cfg: LocalTrainingConfig) -> torch.optim.Optimizer:
    """torch's SGD as `cfg` sets it, for loops that need an optimiser object (opacus wraps it for DP-SGD).
    A fresh one per round is what resets the Nesterov momentum buffer each round."""
    lr, momentum, nesterov = sgd_settings(cfg)
    return torch.optim.SGD(params, lr=lr, momentum=momentum, nesterov=nesterov)


class Sgd:
    """`make_optimizer`'s SGD, stepped through torch's functional form (the code SGD.step runs, so the same
    update bit for bit). Optimizer.step's wrapper (a profiler record, hook look-ups, grad-mode and compiler
    guards), its choice of code path and zero_grad's took 50 µs of a logistic regression's 180 µs step (B = 10,
    one thread). Built per round, as `make_optimizer`'s."""

    def __init__(self, params: Iterable[nn.Parameter], cfg: LocalTrainingConfig) -> None:
        self.params: list[torch.Tensor] = list(params)
        # Detached aliases of the parameters, stepped in place with autograd left on: turning it off and on
        # again costs as much as a small model's update.
        self.values = [p.detach() for p in self.params]
        self.lr, self.momentum, self.nesterov = sgd_settings(cfg)
        if self.nesterov and self.momentum <= 0:
            raise ValueError("Nesterov momentum requires a momentum and zero dampening")  # as torch's SGD
        self.buffers: list[torch.Tensor | None] = [None] * len(self.params)
        # SGD.step's choice of the multi-tensor path, made once: the parameters stay where they are.
        self.foreach = _default_to_fused_or_foreach(self.params, differentiable=False, use_fused=False)[1]

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    def step(self) -> None:
        # As SGD.step: a parameter without a gradient is left as it is, its momentum buffer too.
        live = [i for i, p in enumerate(self.params) if p.grad is not None]
        buffers = [self.buffers[i] for i in live]
        sgd([self.values[i] for i in live], [grad_of(self.params[i]) for i in live], buffers, foreach=self.foreach,
            weight_decay=0.0, momentum=self.momentum, lr=self.lr, dampening=0.0, nesterov=self.nesterov,
            maximize=False)
        for i, buffer in zip(live, buffers, strict=True):
            self.buffers[i] = buffer


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
    forward: nn.Module = model
    opt: Sgd | torch.optim.Optimizer
    if dp_sgd is None:
        opt = Sgd(named.values(), cfg)
    else:
        if proximal is not None or correction is not None:
            # opacus replaces each gradient by the noised sum of per-example ones: a term added to the gradient
            # would be dropped.
            raise ValueError("DP-SGD takes neither a proximal term nor a gradient correction")
        forward, opt = _private(model, make_optimizer(named.values(), cfg), dp_sgd, len(data), cfg.batch_size,
                                generator)
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


def _epochs(model: nn.Module, named: dict[str, nn.Parameter], opt: Sgd | torch.optim.Optimizer,
            data: ArrayDataset, cfg: LocalTrainingConfig, generator: torch.Generator, proximal: Proximal | None,
            correction: Tensors | None) -> tuple[int, float]:
    # opacus's optimiser zeroes the gradients unless told to drop them, as Sgd does.
    clear = opt.zero_grad if isinstance(opt, Sgd) else partial(opt.zero_grad, set_to_none=True)
    add_proximal = proximal.adder(named) if proximal is not None else None
    corrections = [correction[name] for name in named] if correction is not None else None
    steps, loss_sum = 0, 0.0
    for epoch in range(cfg.epochs):
        before_epoch(epoch)  # DVFS: the client picks its frequency (a no-op outside a client process)
        for x, y in minibatches(data, cfg.batch_size, generator):
            clear()
            loss = F.cross_entropy(model(x), y)
            loss_sum += loss.item()
            loss.backward()
            if add_proximal is not None:
                add_proximal()
            if corrections is not None:
                torch._foreach_add_([grad_of(p) for p in named.values()], corrections)
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
