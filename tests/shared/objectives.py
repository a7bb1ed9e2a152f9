"""Closed-form objectives for the tests: where the optimiser's behaviour can be checked exactly.

`quadratic()` is f(x) = ½xᵀAx − bᵀx with A = [[4, 1], [1, 3]], b = [1, 2] by default. Its gradient is
Ax − b (A symmetric), it is m-strongly convex and M-smooth with m = λ_min(A) = (7 − √5)/2 and
M = λ_max(A) = (7 + √5)/2, and its minimiser is x* = A⁻¹b = (1/11, 7/11).

Three first-order methods run on it, each counting the gradient steps until ‖x − x*‖ < tol:
- `gradient_descent`: x ← x − ∇f(x)/M;
- `nesterov`: the classical accelerated gradient, y = x + μ(x − x_prev), x ← y − ∇f(y)/M with
  μ = (√M − √m)/(√M + √m);
- `torch_nesterov`: the project's local optimiser (fl_services.shared.core.training.Sgd with
  optimizer="nesterov", i.e. torch's SGD(nesterov=True): buf ← μ·buf + g, p ← p − lr(g + μ·buf)).
  Its parameter p_k is exactly the classical look-ahead point y_k (x_{k+1} = p_k − lr·∇f(p_k) gives back
  the classical x), so both converge at the accelerated rate; they stop at slightly different counts
  because one watches y and the other x.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import torch

from fl_services.shared.core.config import LocalTrainingConfig
from fl_services.shared.core.training import Sgd

DEFAULT_A = ((4.0, 1.0), (1.0, 3.0))
DEFAULT_B = (1.0, 2.0)


@dataclass(frozen=True)
class Quadratic:
    """f(x) = ½xᵀAx − bᵀx for a symmetric positive definite A, in float64."""

    A: torch.Tensor
    b: torch.Tensor

    def __post_init__(self) -> None:
        if self.A.ndim != 2 or self.A.shape[0] != self.A.shape[1] or self.b.shape != self.A.shape[:1]:
            raise ValueError(f"A must be d×d and b of length d, got {tuple(self.A.shape)} and {tuple(self.b.shape)}")
        if not torch.allclose(self.A, self.A.T):
            raise ValueError("A must be symmetric")
        if torch.linalg.eigvalsh(self.A)[0] <= 0:
            raise ValueError("A must be positive definite (f strongly convex)")

    def value(self, x: torch.Tensor) -> torch.Tensor:
        return 0.5 * x @ self.A @ x - self.b @ x

    def gradient(self, x: torch.Tensor) -> torch.Tensor:
        return self.A @ x - self.b

    @property
    def strong_convexity(self) -> float:
        """m = λ_min(A)."""
        return float(torch.linalg.eigvalsh(self.A)[0])

    @property
    def smoothness(self) -> float:
        """M = λ_max(A): the Lipschitz constant of ∇f."""
        return float(torch.linalg.eigvalsh(self.A)[-1])

    @property
    def optimum(self) -> torch.Tensor:
        return torch.linalg.solve(self.A, self.b)

    @property
    def nesterov_momentum(self) -> float:
        """μ = (√M − √m)/(√M + √m), the momentum of NAG for strongly convex f."""
        sqrt_big, sqrt_small = math.sqrt(self.smoothness), math.sqrt(self.strong_convexity)
        return (sqrt_big - sqrt_small) / (sqrt_big + sqrt_small)


def quadratic(A=DEFAULT_A, b=DEFAULT_B) -> Quadratic:
    return Quadratic(torch.as_tensor(A, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64))


@dataclass(frozen=True)
class Run:
    x: torch.Tensor  # the iterate that met the tolerance (or the last one)
    iterations: int  # gradient steps taken until ‖x − x*‖ < tol
    converged: bool
    distances: list[float] = field(repr=False)  # ‖x_k − x*‖ for k = 0..iterations


def _start(f: Quadratic, x0: torch.Tensor | None) -> torch.Tensor:
    return torch.zeros_like(f.b) if x0 is None else torch.as_tensor(x0, dtype=torch.float64).clone()


def _iterate(x: torch.Tensor, advance: Callable[[torch.Tensor], torch.Tensor], target: torch.Tensor,
             tol: float, max_iter: int) -> Run:
    """x ← advance(x) until ‖x − target‖ < tol (or max_iter steps), recording every distance."""
    distances = [float(torch.linalg.vector_norm(x - target))]
    while distances[-1] >= tol and len(distances) <= max_iter:
        x = advance(x)
        distances.append(float(torch.linalg.vector_norm(x - target)))
    return Run(x, len(distances) - 1, distances[-1] < tol, distances)


def gradient_descent(f: Quadratic, x0: torch.Tensor | None = None, step: float | None = None,
                     tol: float = 1e-8, max_iter: int = 100_000) -> Run:
    """x ← x − step·∇f(x), step 1/M by default."""
    lr = 1.0 / f.smoothness if step is None else step
    return _iterate(_start(f, x0), lambda x: x - lr * f.gradient(x), f.optimum, tol, max_iter)


def nesterov(f: Quadratic, x0: torch.Tensor | None = None, step: float | None = None,
             momentum: float | None = None, tol: float = 1e-8, max_iter: int = 100_000) -> Run:
    """Classical NAG: y = x + μ(x − x_prev); x ← y − step·∇f(y). Defaults: step 1/M, μ as above."""
    lr = 1.0 / f.smoothness if step is None else step
    mu = f.nesterov_momentum if momentum is None else momentum
    x = _start(f, x0)
    previous = x

    def advance(x: torch.Tensor) -> torch.Tensor:
        nonlocal previous
        y = x + mu * (x - previous)
        previous = x
        return y - lr * f.gradient(y)

    return _iterate(x, advance, f.optimum, tol, max_iter)


def torch_nesterov(f: Quadratic, x0: torch.Tensor | None = None, step: float | None = None,
                   momentum: float | None = None, tol: float = 1e-8, max_iter: int = 100_000) -> Run:
    """The project's local optimiser (torch SGD, nesterov=True) minimising f by autograd."""
    lr = 1.0 / f.smoothness if step is None else step
    mu = f.nesterov_momentum if momentum is None else momentum
    p = torch.nn.Parameter(_start(f, x0))
    opt = Sgd([p], LocalTrainingConfig(lr=lr, optimizer="nesterov", momentum=mu))

    def advance(_: torch.Tensor) -> torch.Tensor:
        opt.zero_grad()
        f.value(p).backward()
        opt.step()
        return p.detach().clone()

    return _iterate(p.detach().clone(), advance, f.optimum, tol, max_iter)
