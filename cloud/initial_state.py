"""Version 0 of a run, built when the run is created, so that a config which cannot run is refused then
(HTTP 422) rather than discovered by every client at its first task: its data loads (an imported loader
included), its model builds (an imported factory included) and maps one sample to one logit per class."""
from __future__ import annotations

import asyncio
import logging
import math
import threading

import torch

from fl_services.shared.core.algorithms import privacy, registry
from fl_services.shared.core.algorithms.base import Algorithm
from fl_services.shared.core.config import RunConfig, is_import_path
from fl_services.shared.core.data import load_federated
from fl_services.shared.core.dvfs import epoch_energy, epoch_seconds
from fl_services.shared.core.federation import initial_model
from fl_services.shared.core.models import mlp_parameters
from fl_services.shared.core.records import Record, encode, flatten, non_finite
from fl_services.shared.core.reports import MAX_ENERGY_J, MAX_SECONDS
from fl_services.shared.core.selection import num_selected
from fl_services.shared.core.tensors import Dim
from fl_services.shared.core.user_code import UserCodeError, is_allowed
from fl_services.shared.wire.edge_cloud import GlobalStateHeader

log = logging.getLogger(__name__)


class InvalidRun(ValueError):
    """A config whose data cannot be loaded or whose model does not fit that data (HTTP 422)."""


async def checked_initial_global(run_id: str, config: RunConfig, max_state_bytes: int, max_payload_bytes: int,
                                 allowed_imports: tuple[str, ...], timeout_s: float) -> bytes:
    """`initial_global` on a daemon thread of its own, refused (InvalidRun) past `timeout_s`.

    It runs the config's own code (a loader, a factory), which may never return (a download from a host
    that does not answer, a deadlock). On asyncio's shared pool a few such configs held every worker, and
    every request that decodes on it (each contribution) then waited forever. A thread that never ends
    is abandoned (a daemon, so the cloud still exits) and logged; nothing of its run has been stored."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[bytes] = loop.create_future()

    def settle(outcome: BaseException | bytes) -> None:
        if not done.done():  # cancelled at the time limit
            if isinstance(outcome, BaseException):
                done.set_exception(outcome)
            else:
                done.set_result(outcome)

    def check() -> None:
        try:
            outcome: BaseException | bytes = initial_global(run_id, config, max_state_bytes, max_payload_bytes,
                                                            allowed_imports)
        except BaseException as exc:  # handed to the request, as asyncio.to_thread would
            outcome = exc
        try:
            loop.call_soon_threadsafe(settle, outcome)
        except RuntimeError:  # the loop closed meanwhile: no one is waiting
            pass

    threading.Thread(target=check, name=f"run-check-{run_id}", daemon=True).start()
    try:
        return await asyncio.wait_for(done, timeout_s)
    except TimeoutError as exc:
        log.warning("run %s: its checks (data loading, model building) are still running after %g s; "
                    "the run is refused and the thread abandoned", run_id, timeout_s)
        raise InvalidRun(f"the run's checks (loading its data, building its model) did not finish in {timeout_s:g} s "
                         "(FL_CLOUD_CREATE_TIMEOUT_S); a loader or factory that waits on something never "
                         "returns here either") from exc


def initial_global(run_id: str, config: RunConfig, max_state_bytes: int, max_payload_bytes: int,
                   allowed_imports: tuple[str, ...] = ()) -> bytes:
    for path, what in ((config.model.name, "model.name"), (config.data.dataset, "data.dataset")):
        if is_import_path(path) and not is_allowed(path, allowed_imports):
            raise InvalidRun(f"{what} {path!r} is outside the packages this cloud may import "
                             f"(FL_CLOUD_ALLOWED_IMPORTS: {', '.join(allowed_imports)})")
    try:
        privacy.check_accounting(config)
    except ValueError as exc:
        raise InvalidRun(str(exc)) from exc
    try:
        data = load_federated(config.data, config.seed)
    except (OSError, ValueError, KeyError) as exc:  # e.g. an npz path that is missing or malformed
        raise InvalidRun(f"cannot load the run's data: {exc}") from exc
    _check_devices(config, [len(client.train) for client in data.clients])
    if config.model.name == "mlp":
        # The one built-in whose size the config sets (model.hidden): 100000-wide layers are 40 GB, which
        # the cloud tried to allocate (500) or, a little smaller, held in its model cache. Refused before.
        parameters = mlp_parameters(tuple(data.input_shape), data.num_classes, config.model.hidden)
        _check_state_size("global state", 4 * parameters, max_state_bytes)
    try:
        model = initial_model(config)
    except UserCodeError as exc:
        raise InvalidRun(str(exc)) from exc
    try:
        with torch.no_grad():  # one sample's shape through the model: a CNN on 2×2 images fails here
            out = model(torch.zeros(1, *data.input_shape))
    except Exception as exc:  # an imported model may raise anything on a sample it does not fit
        raise InvalidRun(f"the model {config.model.name!r} does not fit the data's samples "
                         f"{tuple(data.input_shape)}: {type(exc).__name__}: {exc}") from exc
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != (1, data.num_classes):
        shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise InvalidRun(f"the model {config.model.name!r} maps one sample of shape {tuple(data.input_shape)} to "
                         f"{shape}; it must give logits of shape (1, {data.num_classes}) for {data.num_classes} "
                         "classes")
    algorithm = registry.create(config)
    global_ = algorithm.init_global(model)
    broken = non_finite(global_)
    if broken:  # every contribution computed from it would be refused as non-finite: the run could never move
        raise InvalidRun(f"the model {config.model.name!r} starts with non-finite values in {broken}")
    blob = encode(global_, GlobalStateHeader(run_id=run_id, version=0, config=config))
    for what, size in (("global state", len(blob)), ("server memory", algorithm.server_memory_bytes(global_))):
        _check_state_size(what, size, max_state_bytes)
    largest = max(_contribution_bytes(algorithm, global_, edge) for edge in range(config.topology.num_edges))
    if largest > max_payload_bytes:
        raise InvalidRun(f"an edge's contribution would take up to {largest / 2**20:.0f} MiB, over the "
                         f"{max_payload_bytes / 2**20:.0f} MiB the cloud accepts (FL_CLOUD_MAX_PAYLOAD_BYTES); "
                         "use fewer clients per edge, a smaller fraction or a smaller model")
    return blob


def _check_devices(config: RunConfig, samples: list[int]) -> None:
    """Refuses a run whose modelled devices (dvfs) would report a computation time or energy beyond a device
    report's bounds: each client then failed every task (its result could not be made). The most a task can
    take is every epoch at the lowest frequency; its energy is largest at an end of the frequency range."""
    epochs = config.local.epochs
    for client_id, n in enumerate(samples):
        name, profile, _ = config.dvfs.device(client_id)
        ends = (profile.frequencies_ghz[0], profile.f_max)
        seconds = epochs * epoch_seconds(profile, n, ends[0])
        energy = epochs * max(epoch_energy(profile, n, f) for f in ends)
        if seconds > MAX_SECONDS or energy > MAX_ENERGY_J:
            raise InvalidRun(f"client {client_id}'s device ({name}, {n} samples, {epochs} epochs) would take up to "
                             f"{seconds:.3g} s and {energy:.3g} J a task, beyond what a device report holds "
                             f"({MAX_SECONDS:g} s, {MAX_ENERGY_J:g} J): lower dvfs cycles_per_sample or "
                             "capacitance, or raise the frequencies")


def _check_state_size(what: str, size: int, max_state_bytes: int) -> None:
    if size > max_state_bytes:
        raise InvalidRun(f"the run's {what} would take {size / 2**20:.0f} MiB, over the "
                         f"{max_state_bytes / 2**20:.0f} MiB one Redis value may hold here "
                         "(FL_CLOUD_MAX_STATE_BYTES); use fewer clients or clusters, or a smaller model")


def _contribution_bytes(algorithm: Algorithm, global_: Record, edge: int) -> int:
    """The most an edge's contribution can hold: its tensors for as many of its clients as one global
    round can involve (m per edge round, κ edge rounds)."""
    config = algorithm.config
    own = config.clients_of_edge(edge)
    clients = own[:min(len(own), num_selected(config.fraction, len(own)) * config.topology.edge_rounds)]
    spec = flatten(algorithm.wire_spec(algorithm.contribution_spec(global_, clients)))
    data = sum(math.prod(d.max if isinstance(d, Dim) else d for d in shape) * torch.empty(0, dtype=dtype).element_size()
               for shape, dtype in spec.values())
    # The safetensors header: an entry per tensor, and the message with a line per client (a few metrics).
    return data + 100 * len(spec) + 300 * len(clients) + 1_000
