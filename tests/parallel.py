"""The reference runner on both cores: independent runs, each in a process of its own (spawned: no fork of a
process whose torch has started threads), with one torch thread as every test trains."""
from __future__ import annotations

import multiprocessing
from concurrent.futures import ProcessPoolExecutor

from fl_services.shared.core.config import RunConfig
from fl_services.shared.core.reference import ReferenceResult, run_reference


def _one_thread() -> None:
    import torch

    torch.set_num_threads(1)


def run_references(*configs: RunConfig) -> list[ReferenceResult]:
    """`run_reference(config)` of each, in parallel; the same results as one after the other (each run is
    deterministic given its config)."""
    with ProcessPoolExecutor(max_workers=len(configs), mp_context=multiprocessing.get_context("spawn"),
                             initializer=_one_thread) as pool:
        return list(pool.map(run_reference, configs))
