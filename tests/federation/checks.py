"""What the federation tests assert of a finished run: it equals the in-process reference runner."""
from __future__ import annotations

import asyncio

import pytest
import torch

from fl_services.shared.core.config import RunConfig
from fl_services.shared.core.reference import ReferenceResult, run_reference
from fl_services.shared.core.reports import RoundRecord, RunStatus
from fl_services.shared.core.tensors import Tensors
from tests.federation.harness import Admin


async def reference(config: RunConfig, **kwargs) -> ReferenceResult:
    """The reference runner on a thread of its own: it runs its own event loop, and the federation's goes on."""
    return await asyncio.to_thread(run_reference, config, **kwargs)


async def run(admin: Admin, config: RunConfig, timeout_s: float = 300) -> tuple[str, list[RoundRecord], Tensors]:
    """Creates and starts the run, waits for it to finish: its id, history and model."""
    info = await admin.create_run(config)
    assert info.status == RunStatus.created and info.version == 0
    await admin.action(info.run_id, "start")
    final = await admin.wait(info.run_id, timeout_s=timeout_s)
    assert final.status == RunStatus.finished and final.version == config.rounds, final
    return info.run_id, await admin.history(info.run_id), await admin.model(info.run_id)


def assert_same_model(distributed: Tensors, expected: Tensors, atol: float = 1e-5) -> None:
    assert distributed.keys() == expected.keys()
    for name in expected:
        assert torch.allclose(distributed[name].to(expected[name].dtype), expected[name], atol=atol), name


async def assert_equals_reference(admin: Admin, run_id: str, config: RunConfig,
                                  timeout_s: float = 300) -> list[RoundRecord]:
    """Waits for the run to finish; its clients, model, accuracies and client metrics are the reference's."""
    expected = asyncio.ensure_future(reference(config))  # computed while the services train
    final = await admin.wait(run_id, timeout_s=timeout_s)
    assert final.status == RunStatus.finished and final.version == config.rounds
    history = await admin.history(run_id)
    model = await admin.model(run_id)
    want = await expected
    assert [[(c.client_id, c.edge_id) for c in h.clients] for h in history] ==\
        [[(c.client_id, c.edge_id) for c in h.clients] for h in want.history]
    assert_same_model(model, want.global_state)  # the model as the REST API serves it (model_parameters)
    for got, ref in zip(history, want.history, strict=True):
        assert got.test_accuracy == pytest.approx(ref.test_accuracy, abs=3e-3, nan_ok=True)  # NaN: "federated"
        assert got.client_metrics == pytest.approx(ref.client_metrics, abs=1e-6)
        assert_same_federated(got, ref)
    return history


def fixed_point_bound(config: RunConfig, expected: Tensors) -> Tensors:
    """Each device's coordinate is rounded to the nearest multiple of 2^-f, an error of at most 2^-(f+1); the edge's
    sum Σ w_k q_k / W is a weighted mean of them, so the step errs by at most 2^-(f+1) and the model by
    η_s·2^-(f+1). Beyond that, both paths round the sum to float32 once on the wire and the model once: four
    float32 roundings of the values involved at most."""
    f = config.secure_aggregation.scale_bits
    eps = torch.finfo(torch.float32).eps
    return {name: config.server_lr * 2.0 ** -(f + 1) + 4 * eps * (t.abs() + 1) for name, t in expected.items()}


def assert_within_fixed_point(model: Tensors, expected: Tensors, config: RunConfig) -> float:
    bound = fixed_point_bound(config, expected)
    worst = 0.0
    for name, t in expected.items():
        diff = (model[name].to(torch.float64) - t.to(torch.float64)).abs()
        assert bool((diff <= bound[name]).all()), (name, float(diff.max()), float(bound[name].max()))
        worst = max(worst, float(diff.max()))
    return worst


def assert_same_federated(got: RoundRecord, ref: RoundRecord) -> None:
    """The record's federated evaluation is the reference's: the same versions, sites, devices and sample counts, and
    figures up to the models' float summation order (as test_accuracy)."""
    def shape(record: RoundRecord) -> list:
        return [(f.version, f.num_samples, [(s.edge_id, s.num_samples) for s in f.sites]) for f in record.federated]

    def figures(record: RoundRecord) -> list[float]:
        return [x for f in record.federated for e in [f, *f.sites] for x in (e.loss, e.accuracy)] + \
            [x for c in record.clients if c.evaluation for x in (c.evaluation.loss, c.evaluation.accuracy)]

    assert shape(got) == shape(ref)
    assert [(c.client_id, c.evaluation and c.evaluation.num_samples) for c in got.clients] == \
        [(c.client_id, c.evaluation and c.evaluation.num_samples) for c in ref.clients]
    assert figures(got) == pytest.approx(figures(ref), abs=3e-3)
