"""A client process's kept models: each task gets what a fresh build gives it, and the same update."""
from __future__ import annotations

from dataclasses import replace
from functools import partial

import torch

from fl_services.client.models import ModelPool
from fl_services.shared.core.algorithms import registry
from fl_services.shared.core.config import RunConfig
from fl_services.shared.core.data import PartitionSource
from fl_services.shared.core.device import CPU, local_update
from fl_services.shared.core.federation import initial_model, local_job, model_factory
from fl_services.shared.core.training import parameters_of


def config(optimizer: str = "sgd") -> RunConfig:
    return RunConfig(name="pool", rounds=2, model={"name": "flower_cnn"},
                     data={"dataset": "mnist5k", "num_clients": 50, "client_holdout": 0},
                     local={"epochs": 2, "batch_size": 8, "lr": 0.05, "optimizer": optimizer})


def test_a_kept_model_comes_back_as_built_and_two_builds_in_one_task_are_two_models():
    cfg = config()
    pool = ModelPool()
    first = pool.for_task(model_factory(cfg))()
    fresh = {k: v.clone() for k, v in first.state_dict().items()}
    with torch.no_grad():
        for p in first.parameters():
            p.add_(1.0)
            p.requires_grad_(False)
    first.eval()
    build = pool.for_task(model_factory(cfg))
    again, other = build(), build()
    assert again is first and other is not first
    assert all(torch.equal(v, fresh[k]) for k, v in again.state_dict().items())
    assert again.training and all(p.requires_grad and p.grad is None for p in again.parameters())


def test_updates_from_kept_models_equal_those_from_fresh_ones_task_after_task():
    for optimizer in ("sgd", "nesterov"):
        cfg = config(optimizer)
        algorithm = registry.create(cfg)
        task = {"model": parameters_of(initial_model(cfg))}
        pool = ModelPool()
        for k in range(6):
            data = PartitionSource.of_run(cfg.data, cfg.seed, k).client_data()
            fresh = local_update(algorithm, local_job(cfg, k, 1, data), task, {}, CPU)
            job = local_job(cfg, k, 1, data)  # its own generator: the batch order drawn again
            kept = local_update(algorithm, replace(job, model_factory=pool.for_task(job.model_factory)), task, {},
                                CPU)
            assert fresh.loss == kept.loss
            assert all(torch.equal(fresh.tensors["model"][n], kept.tensors["model"][n]) for n in task["model"])


def test_imported_models_are_built_each_time():
    factory = model_factory(config())
    imported = factory.args[0].model_copy(update={"name": "tests.client.nowhere:factory"})
    wrapped = partial(factory.func, imported, *factory.args[1:])
    assert ModelPool().for_task(wrapped) is wrapped
