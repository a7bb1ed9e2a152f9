"""Seeds derived from the run seed: every owner (edge selection, a client's batches) gets its own stream.

Derivation goes through numpy's SeedSequence so that (seed, round, client) tuples that differ in any
position give unrelated streams, and nothing touches a global generator.
"""
from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import torch

# Tags keep streams of different owners apart even when the other coordinates coincide.
SELECTION, LOCAL_TRAINING, MODEL_INIT, CLASSIFIER, PRIVACY_NOISE = 1, 2, 3, 4, 5


def derive_seed(*entropy: int) -> int:
    return int(np.random.SeedSequence([int(e) for e in entropy]).generate_state(1, dtype=np.uint64)[0] >> 1)


def torch_generator(*entropy: int) -> torch.Generator:
    return torch.Generator().manual_seed(derive_seed(*entropy))


def numpy_generator(*entropy: int) -> np.random.Generator:
    return np.random.default_rng(derive_seed(*entropy))


_DEFAULT_GENERATOR = threading.RLock()


@contextmanager
def seeded_default_generator(seed: int) -> Iterator[None]:
    """torch's layer initialisers draw only from the process-wide default generator: fork it (the
    caller's RNG is untouched) and seed it, under a lock, because the cloud builds models in several
    worker threads at once (creating a run while another evaluates) and their draws would interleave. The lock
    holds only against the threads that take it: any other draw from the default generator, on any thread, moves
    the weights of a build going on meanwhile, so a module whose weights are loaded anyway is built on the meta
    device (hfpl's G) rather than initialised."""
    with _DEFAULT_GENERATOR, torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield
