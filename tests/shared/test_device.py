"""The compute device: its setting, and a path that leaves CPU results as they were, bit for bit (the services'
settings: tests/client/test_config.py, tests/cloud/test_config.py).

Whole reference runs go through the device path (clients' local updates with `device.local_update`, the cloud's
evaluation and hfpl's classifier under `computing_on`) and are compared with the plain runs. The CUDA tests run
where torch sees a GPU (within tolerances, docs/explanation-determinism-gpu.md); elsewhere they are skipped.
"""
from __future__ import annotations

from functools import partial

import pytest
import torch

from fl_services.shared.core import device
from fl_services.shared.core.algorithms import registry
from fl_services.shared.core.algorithms.base import ClientResult, LocalJob
from fl_services.shared.core.config import ModelConfig, RunConfig
from fl_services.shared.core.data import ArrayDataset, ClientData
from fl_services.shared.core.edge_round import ClientTask
from fl_services.shared.core.federation import evaluate_global, initial_model, local_job
from fl_services.shared.core.models import build_model
from fl_services.shared.core.reference import InProcessClients, ReferenceResult, run_reference
from fl_services.shared.core.reports import RoundRecord

CPU = torch.device("cpu")
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no CUDA device")
DIGITS = {"dataset": "digits", "num_clients": 4}
# Two rounds of each algorithm whose client mixes tensors of the task or its state with the model's.
CONFIGS = {
    "fedavg": dict(model={"name": "cnn"}),
    "fedprox": dict(algorithm="fedprox", model={"name": "mlp"}, params={"mu": 0.1}),
    "scaffold": dict(algorithm="scaffold", model={"name": "mlp"}),
    "pfedme": dict(algorithm="pfedme", model={"name": "mlp"}, params={"local_rounds": 4, "inner_steps": 2}),
    "fedscavar": dict(algorithm="fedscavar", model={"name": "mlp"}, fraction=0.5,
                      params={"mu": 0.1, "capacities": [1.0, 0.5, 0.5, 1.0]}),
    "fedsgd": dict(algorithm="fedsgd", model={"name": "logreg"}),
    "client-noise": dict(model={"name": "mlp"}, weighting="uniform",
                         privacy={"noise": "client", "noise_multiplier": 0.5, "clip_norm": 1.0}),
    "hfpl": dict(algorithm="hfpl", data={"dataset": "digits", "num_clients": 6, "partition": "dirichlet",
                                         "alpha": 0.3},
                 topology={"num_edges": 3, "buffer_size": 2}, params={"proto_weight": 0.05}),
}


def config_of(name: str, **change) -> RunConfig:
    base = {"rounds": 2, "seed": 3, "data": DIGITS, "local": {"epochs": 2, "batch_size": 32, "lr": 0.05}}
    return RunConfig.model_validate({**base, **CONFIGS[name], **change})


class DeviceClients(InProcessClients):
    """The reference runner's clients, trained through the client's device path."""

    on: torch.device = CPU

    async def train(self, tasks: list[ClientTask]) -> list[ClientResult]:
        results = []
        for t in tasks:
            job = local_job(self.algorithm.config, t.client_id, t.round, self.data.clients[t.client_id])
            update = device.local_update(self.algorithm, job, t.tensors, self.states.get(t.client_id, {}), self.on)
            self.states[t.client_id] = update.state
            results.append(ClientResult(t.client_id, update.num_samples, update.loss, update.tensors, update.metrics))
        return results


def on_device(config: RunConfig, where: torch.device) -> ReferenceResult:
    clients = type("Clients", (DeviceClients,), {"on": where})
    with device.computing_on(where):  # the cloud's side: evaluation, hfpl's classifier
        return run_reference(config, clients=clients)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit for bit (NaN included, where torch.equal says no)."""
    return (a.dtype, a.shape) == (b.dtype, b.shape) and \
        a.contiguous().reshape(-1).view(torch.uint8).equal(b.contiguous().reshape(-1).view(torch.uint8))


def figures(record: RoundRecord) -> tuple:
    return record.train_loss, record.test_loss, record.test_accuracy, record.client_metrics, record.server_metrics


def records_of(result: ReferenceResult) -> list[tuple[str, torch.Tensor]]:
    """Every tensor a run leaves: the global state, the clients' states and the cloud's memory."""
    named = [(f"global/{g}/{n}", t) for g, ts in result.global_record.items() for n, t in ts.items()]
    named += [(f"client {k}/{g}/{n}", t) for k, state in sorted(result.client_states.items())
              for g, ts in state.items() for n, t in ts.items()]
    return named + [(f"cloud/{g}/{n}", t) for g, ts in result.cloud_state.items() for n, t in ts.items()]


# ---- the setting --------------------------------------------------------------------------------------
def test_resolve():
    assert device.resolve(" cpu ") == CPU
    gpu = torch.cuda.is_available()
    assert device.resolve("auto") == (torch.device("cuda", torch.cuda.current_device()) if gpu else CPU)
    for spec in ("", "cuda:", "cuda:-1", "cuda:0:1", "mps", "cuda0"):
        with pytest.raises(ValueError, match="device must be auto, cpu, cuda or cuda:N"):
            device.resolve(spec)


def test_auto_is_the_cpu_without_a_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert device.resolve("auto") == CPU


# ---- the path --------------------------------------------------------------------------------------------
def test_a_job_on_a_device_has_its_data_and_models_there_and_its_generator_on_the_cpu():
    # The meta device stands in for a GPU: nothing is computed, only placed.
    data = ArrayDataset(torch.zeros(4, 2), torch.tensor([0, 1, 0, 1]))
    job = LocalJob(0, 0, ClientData(data, data), partial(build_model, ModelConfig(name="logreg"), (2,), 2),
                   torch.Generator().manual_seed(0))
    meta = torch.device("meta")
    moved = device.job_on(job, meta)
    assert moved.data.train.x.is_meta and moved.data.test.y.is_meta and not job.data.train.x.is_meta
    assert all(p.is_meta for p in moved.model_factory().parameters())
    assert all(p.is_meta for p in moved.model_factory(seed=1).parameters())
    assert moved.generator is job.generator
    record = {"model": {"w": torch.ones(2, 3).T}}  # not contiguous
    assert device.record_to(record, meta)["model"]["w"].is_meta
    back = device.record_on_cpu(record)["model"]["w"]
    assert back.device == CPU and back.is_contiguous() and torch.equal(back, record["model"]["w"])


def test_the_context_names_the_device_and_is_restored():
    meta = torch.device("meta")
    assert device.current() == CPU
    with device.computing_on(meta):
        assert device.current() == meta
    assert device.current() == CPU


@pytest.mark.parametrize("name", ["fedavg", "fedprox", "scaffold", "hfpl", "pfedme", "fedscavar", "client-noise"])
def test_the_device_path_on_the_cpu_gives_todays_run_bit_for_bit(name):
    config = config_of(name)
    plain, through = run_reference(config), on_device(config, CPU)
    for (key, a), (other, b) in zip(records_of(plain), records_of(through), strict=True):
        assert key == other
        assert same_bits(a, b), key
    for a, b in zip(plain.history, through.history, strict=True):  # repr: exact, and NaN (not evaluated) is NaN
        assert repr(figures(a)) == repr(figures(b))


def test_dp_sgd_on_the_cpu_draws_its_noise_as_before():
    config = config_of("fedavg", model={"name": "logreg"}, privacy={"dp_sgd_noise_multiplier": 1.0})
    plain, through = run_reference(config), on_device(config, CPU)
    assert all(same_bits(plain.global_state[n], through.global_state[n]) for n in plain.global_state)


def test_the_cloud_evaluates_on_the_context_device():
    config = config_of("fedavg")
    algorithm = registry.create(config)
    global_ = algorithm.init_global(initial_model(config))
    with device.computing_on(CPU):
        assert evaluate_global(config, algorithm, global_, {}) == evaluate_global(config, algorithm, global_, {})


# ---- on a GPU --------------------------------------------------------------------------------------------
# After two rounds of local SGD in float32, a GPU's model differs from the CPU's by float32 rounding compounded
# over the steps (docs/explanation-determinism-gpu.md): far below these bounds, far above 0.
ATOL, RTOL = 1e-3, 1e-3


@CUDA
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_on_cuda_the_run_stays_within_float32_rounding_of_the_cpus(name):
    config = config_of(name)
    cpu, gpu = run_reference(config), on_device(config, torch.device("cuda"))
    for (key, a), (_, b) in zip(records_of(cpu), records_of(gpu), strict=True):
        assert b.device == CPU and b.dtype == a.dtype and b.is_contiguous(), key
        if key.startswith("cloud/evaluation/"):  # hfpl's held-out figures: one prediction flipped moves them by 1/n
            assert torch.allclose(a, b, atol=0.1, equal_nan=True), key
        elif a.is_floating_point():
            assert torch.allclose(a, b, atol=ATOL, rtol=RTOL), (key, float((a - b).abs().max()))
        else:
            assert torch.equal(a, b), key
    for a, b in zip(cpu.history, gpu.history, strict=True):
        assert [c.client_id for c in a.clients] == [c.client_id for c in b.clients]
        assert a.train_loss == pytest.approx(b.train_loss, rel=1e-3)


@CUDA
def test_on_cuda_dp_sgd_trains_with_noise_from_a_cuda_generator():
    config = config_of("fedavg", model={"name": "logreg"}, privacy={"dp_sgd_noise_multiplier": 1.0})
    gpu, again = on_device(config, torch.device("cuda")), on_device(config, torch.device("cuda"))
    for name, t in gpu.global_state.items():
        assert t.device == CPU and bool(torch.isfinite(t).all())
        assert torch.allclose(t, again.global_state[name], atol=ATOL, rtol=RTOL)
