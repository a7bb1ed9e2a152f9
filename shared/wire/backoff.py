"""Bounded exponential backoff, the one policy every retry loop of the services uses."""
from __future__ import annotations

import random


class Backoff:
    """Delays of `initial_s`, times `factor` after each failure, up to `cap_s`; `reset()` after a success.

    `jitter` (0 to 1) draws each delay uniformly from [(1 - jitter)·d, d], so that many waiters that failed
    together do not all come back at once; the draws come from `rng` (or a generator of its own, seeded by
    `seed`), never from the global `random` state, which a seeded run must not see consumed.
    """

    def __init__(self, initial_s: float, cap_s: float, factor: float = 2.0, jitter: float = 0.0,
                 rng: random.Random | None = None, seed: int | None = None):
        if initial_s < 0 or factor < 1 or not 0 <= jitter <= 1:
            raise ValueError(f"backoff needs initial_s >= 0, factor >= 1, 0 <= jitter <= 1 "
                             f"(got {initial_s}, {factor}, {jitter})")
        self.initial_s, self.cap_s, self.factor, self.jitter = initial_s, max(cap_s, initial_s), factor, jitter
        self._rng = rng if rng is not None else random.Random(seed)
        self.failures = 0
        self._delay = initial_s

    def next(self) -> float:
        """The delay before the next attempt (counts one more failure)."""
        delay, self._delay = self._delay, min(self._delay * self.factor, self.cap_s)
        self.failures += 1
        if self.jitter:
            delay *= 1 - self.jitter * self._rng.random()
        return delay

    def reset(self) -> None:
        self.failures, self._delay = 0, self.initial_s
