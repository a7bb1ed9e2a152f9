"""Version 0 of a run, built when the run is created, so that a config which cannot run is refused then
(HTTP 422) rather than discovered by every client at its first task."""
from __future__ import annotations

import torch

from shared.algorithms import registry
from shared.config import RunConfig
from shared.data.datasets import load_federated
from shared.federation import initial_model
from shared.schemas import GlobalStateHeader
from shared.transport.tensors import encode


class InvalidRun(ValueError):
    """A config whose data cannot be loaded or whose model does not fit that data (HTTP 422)."""


def initial_global(run_id: str, config: RunConfig, max_state_bytes: int) -> bytes:
    try:
        data = load_federated(config.data, config.seed)
    except (OSError, ValueError, KeyError) as exc:  # e.g. an npz path that is missing or malformed
        raise InvalidRun(f"cannot load the run's data: {exc}") from exc
    try:
        model = initial_model(config)
        with torch.no_grad():  # one sample's shape through the model: a CNN on 2×2 images fails here
            model(torch.zeros(1, *data.input_shape))
    except (ValueError, RuntimeError) as exc:
        raise InvalidRun(f"the model {config.model.name!r} does not fit the data's samples "
                         f"{tuple(data.input_shape)}: {exc}") from exc
    algorithm = registry.create(config)
    global_ = algorithm.init_global(model)
    blob = encode(global_, GlobalStateHeader(run_id=run_id, version=0, config=config))
    for what, size in (("global state", len(blob)), ("server memory", algorithm.server_memory_bytes(global_))):
        if size > max_state_bytes:
            raise InvalidRun(f"the run's {what} would take {size / 2**20:.0f} MiB, over the "
                             f"{max_state_bytes / 2**20:.0f} MiB one Redis value may hold here "
                             "(FL_CLOUD_MAX_STATE_BYTES); use fewer clients or clusters, or a smaller model")
    return blob
