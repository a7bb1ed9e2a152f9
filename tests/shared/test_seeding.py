"""Seeded model construction: the same seed gives the same weights, whatever other threads build."""
from __future__ import annotations

import threading

import pytest
import torch

from fl_services.shared.core.algorithms import registry
from fl_services.shared.core.config import ModelConfig, RunConfig
from fl_services.shared.core.models import build_feature_extractor, build_model
from fl_services.shared.core.reference import run_reference


def _flat(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def test_concurrent_builds_draw_the_same_weights_as_serial_ones() -> None:
    """The cloud builds models in worker threads at once (a run being created while another run's
    update evaluates): torch's initialisers share one default generator, so without the lock their
    draws interleave and a run starts from weights that its seed does not give."""
    cnn = ModelConfig(name="cnn")
    builds = {
        1: lambda: build_model(cnn, (1, 28, 28), 10, seed=1),
        2: lambda: build_model(cnn, (1, 28, 28), 10, seed=2),
        3: lambda: build_feature_extractor("cnn_deep", (1, 28, 28), 64, seed=3),
    }
    expected = {seed: _flat(build()) for seed, build in builds.items()}
    mismatches: list[int] = []

    def worker(seed: int) -> None:
        for _ in range(60):
            if not torch.equal(_flat(builds[seed]()), expected[seed]):
                mismatches.append(seed)

    threads = [threading.Thread(target=worker, args=(seed,)) for seed in builds]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert mismatches == []


def test_a_seeded_build_leaves_the_callers_generator_alone() -> None:
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    build_model(ModelConfig(name="mlp"), (1, 28, 28), 10, seed=7)
    assert torch.equal(torch.rand(3), expected)


@pytest.mark.parametrize("algorithm", registry.available())
def test_no_algorithm_draws_from_the_default_generator(algorithm: str) -> None:
    """The lock of seeded builds holds only against the threads that take it: in the services, clients train and
    evaluate on threads of their own while another builds its seeded model, so one hook drawing unlocked from the
    process-wide generator would give that model other weights than its seed does."""
    config = RunConfig.model_validate({"algorithm": algorithm, "rounds": 1, "fraction": 1.0,
                                       "data": {"dataset": "digits", "num_clients": 2},
                                       "local": {"epochs": 1, "batch_size": 32}})
    torch.manual_seed(123)
    before = torch.get_rng_state()
    run_reference(config)
    assert torch.equal(torch.get_rng_state(), before)
