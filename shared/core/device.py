"""The compute device: where a client's local training and the cloud's evaluation run (the CPU, or a CUDA GPU).

This is torch's device, where tensors live while they are computed with; DVFS's device (shared/core/dvfs.py) is
the modelled client hardware, another thing.

Everything outside the computation stays on the CPU, so that the edges, the cloud and the wire see what they
see of a CPU client: records arrive and leave on the CPU, the initial model is built and seeded there, and the
randomness that defines batch order (and privacy noise) is drawn from CPU generators. Only the model, the
batches and the tensors a hook combines with the model's (FedProx's centre, SCAFFOLD's controls, hfpl's
prototypes) live on the device while they are computed with. `local_update` is that path for a client's hook;
`computing_on` names the device for whatever runs in its context (a ContextVar, as the DVFS epoch hook), which
the cloud's evaluation (federation.evaluate_global) and hfpl's classifier training consult.

On the CPU every move is the identity (`Tensor.to` returns the tensor itself), so the path gives the models
the reference runner gives, bit for bit. CUDA kernels are not bit-reproducible: see
docs/explanation-determinism-gpu.md.
"""
from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import replace
from functools import partial
from typing import Any, Callable

import torch
from torch import nn

from fl_services.shared.core.algorithms.base import Algorithm, ClientUpdate, LocalJob
from fl_services.shared.core.data import ArrayDataset
from fl_services.shared.core.records import Record
from fl_services.shared.core.tensors import Tensors
from fl_services.shared.core.training import device_of

CPU = torch.device("cpu")
COMPUTE_DEVICE: ContextVar[torch.device] = ContextVar("compute_device", default=CPU)
_SPEC = re.compile(r"cuda(?::(\d+))?")


def resolve(spec: str) -> torch.device:
    """A device setting as a torch device of this machine: "cpu", "cuda" (the current GPU), "cuda:N", or "auto"
    (cuda where torch sees a GPU, else cpu). Raises ValueError, saying why, for anything else, and for a GPU
    this machine does not have: a service must refuse to start rather than fail at its first task."""
    text = spec.strip().lower()
    if text == "auto":
        text = "cuda" if torch.cuda.is_available() else "cpu"
    if text == "cpu":
        return CPU
    match = _SPEC.fullmatch(text)
    if match is None:
        raise ValueError(f"device must be auto, cpu, cuda or cuda:N, got {spec!r}")
    if not torch.cuda.is_available():
        why = "this torch is built without CUDA" if torch.version.cuda is None else "torch sees no GPU"
        raise ValueError(f"device {spec!r}: CUDA is not available on this machine ({why}, torch {torch.__version__})")
    index = torch.cuda.current_device() if match.group(1) is None else int(match.group(1))
    if index >= torch.cuda.device_count():
        raise ValueError(f"device {spec!r}: this machine has {torch.cuda.device_count()} CUDA device(s), "
                         f"cuda:0 to cuda:{torch.cuda.device_count() - 1}")
    return torch.device("cuda", index)


def current() -> torch.device:
    """The device set by the innermost `computing_on` of this context; the CPU elsewhere."""
    return COMPUTE_DEVICE.get()


@contextmanager
def computing_on(device: torch.device) -> Iterator[None]:
    """`current()` is `device` within, in this thread and in the tasks and threads started from it."""
    if device.type == "cuda":
        ieee_float32()
    token = COMPUTE_DEVICE.set(device)
    try:
        yield
    finally:
        COMPUTE_DEVICE.reset(token)


def ieee_float32() -> None:
    """float32 products and convolutions on a GPU in float32, as on the CPU: not TF32 (10-bit mantissas), which
    cuDNN's convolutions use by default on Ampere and later and which would take a GPU's model 1e-3 (relative)
    from the CPU's at every layer. Set for the whole process: torch's flags are global."""
    backends = torch.backends
    if hasattr(backends.cudnn, "conv") and hasattr(backends.cudnn.conv, "fp32_precision"):  # torch ≥ 2.9
        backends.cudnn.conv.fp32_precision = "ieee"
        backends.cuda.matmul.fp32_precision = "ieee"
    else:
        backends.cudnn.allow_tf32 = False
        backends.cuda.matmul.allow_tf32 = False


def tensors_to(tensors: Tensors, device: torch.device) -> Tensors:
    return {name: t.to(device) for name, t in tensors.items()}


def record_to(record: Record, device: torch.device) -> Record:
    return {group: tensors_to(members, device) for group, members in record.items()}


def on_cpu(tensors: Tensors) -> Tensors:
    """`tensors` as they leave a computation for the wire or the disk: on the CPU, contiguous, dtypes kept."""
    return {name: t.to(CPU).contiguous() for name, t in tensors.items()}


def record_on_cpu(record: Record) -> Record:
    return {group: on_cpu(members) for group, members in record.items()}


def dataset_to(data: ArrayDataset, device: torch.device) -> ArrayDataset:
    return replace(data, x=data.x.to(device), y=data.y.to(device))


def _built_on(factory: Callable[..., nn.Module], device: torch.device, *args: Any, **kwargs: Any) -> nn.Module:
    # Built (and seeded) on the CPU, as everywhere, then moved: the device starts from the same weights. A model
    # already there (on the CPU, or kept by a client process, client/models.py) is not moved: `to` walks every
    # module even then.
    model = factory(*args, **kwargs)
    return model if device_of(model) == device else model.to(device)


def job_on(job: LocalJob, device: torch.device) -> LocalJob:
    """`job` with its data on `device` and a model factory that builds there; its generator stays the CPU's, so
    the batch order is the CPU's."""
    data = replace(job.data, train=dataset_to(job.data.train, device), test=dataset_to(job.data.test, device))
    return replace(job, data=data, model_factory=partial(_built_on, job.model_factory, device))


def local_update(algorithm: Algorithm, job: LocalJob, task: Record, state: Record,
                 device: torch.device) -> ClientUpdate:
    """`algorithm.local_update(job, task, state)` computed on `device`: the job's data and model, the task and
    the client's state moved there, and the update's tensors and state brought back to the CPU."""
    with computing_on(device):
        update = algorithm.local_update(job_on(job, device), record_to(task, device), record_to(state, device))
    return replace(update, tensors=record_on_cpu(update.tensors), state=record_on_cpu(update.state))
