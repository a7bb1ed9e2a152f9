"""The weighted sum's inner loop as one fused pass (numba), when numba is installed (the `server` extra: the
edges aggregate).

torch adds a float32 term into a float64 sum in three passes over a scratch chunk (cast, multiply, add), each
one a kernel launch over memory; here each element of four clients' chunks is loaded, widened, multiplied and
added into a register that holds the sum, and the sum's chunk is read and written once per four clients. The
roundings are those of `sum + x.double() * w` client after client, in the same order (numba compiles without
fast-math, so no multiply-add is fused into one rounding): bit-identical to the torch path, which stays the
path without numba and for any dtype but float32.
"""
from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from typing import Any

import numpy as np

# Below this many elements a sum is not worth a compilation (about a second, once per process): tests' and small
# models' tensors take the torch path.
MIN_ELEMENTS = 65_536

Kernels = tuple[Callable[..., None], Callable[..., None]]


@functools.cache
def kernels() -> Kernels | None:
    """(add four weighted terms, add one), compiled on first use; None without numba."""
    try:
        numba: Any = importlib.import_module("numba")
    except ModuleNotFoundError:
        return None
    jit: Callable[[Callable[..., None]], Callable[..., None]] = numba.njit(nogil=True, boundscheck=False,
                                                                           fastmath=False, cache=False)

    @jit
    def add4(into: np.ndarray, x0: np.ndarray, x1: np.ndarray, x2: np.ndarray, x3: np.ndarray,
             w0: float, w1: float, w2: float, w3: float) -> None:
        for i in range(into.shape[0]):
            into[i] = (((into[i] + np.float64(x0[i]) * w0) + np.float64(x1[i]) * w1)
                       + np.float64(x2[i]) * w2) + np.float64(x3[i]) * w3

    @jit
    def add1(into: np.ndarray, x: np.ndarray, w: float) -> None:
        for i in range(into.shape[0]):
            into[i] += np.float64(x[i]) * w

    return add4, add1


def accumulate(kernel: Kernels, into: np.ndarray, terms: list[tuple[float, np.ndarray]], chunk: int) -> None:
    """into += x · w for every (w, x) in order (into float64, every x float32, all flat and as long), a chunk of
    `into` at a time so that it stays in the core's cache while every term is added to it."""
    add4, add1 = kernel
    whole = len(terms) - len(terms) % 4
    for start in range(0, into.shape[0], chunk):
        end = start + chunk
        part = into[start:end]
        for k in range(0, whole, 4):
            (w0, x0), (w1, x1), (w2, x2), (w3, x3) = terms[k : k + 4]
            add4(part, x0[start:end], x1[start:end], x2[start:end], x3[start:end], w0, w1, w2, w3)
        for w, x in terms[whole:]:
            add1(part, x[start:end], w)
