"""One global round as an edge runs it, written once for the edge service and the reference runner.

The edge trains its selected clients on the global state (κ = 1), or runs κ edge rounds on its own
edge model before it reports (hierarchical FedAvg). How clients are trained is the caller's: the edge
service dispatches tasks over HTTP and waits, the reference runner calls `local_update` in-process.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Awaitable, Callable, Collection

from fl_services.shared.core.algorithms.base import Algorithm, ClientResult, EdgeAggregate
from fl_services.shared.core.config import RunConfig
from fl_services.shared.core.dvfs import epoch_seconds, paced_seconds
from fl_services.shared.core.federation import client_round
from fl_services.shared.core.records import Record
from fl_services.shared.core.reports import Member


@dataclass(frozen=True)
class ClientTask:
    client_id: int
    round: int
    tensors: Record


@dataclass(frozen=True)
class SecureSum:
    """What secure aggregation gives an edge instead of its clients' results: their weighted sum (float64, as
    edge_aggregate's), its total weight, and the results' participation with no tensors (for the history)."""

    sums: Record
    weight: float
    results: list[ClientResult]


# Trains the given tasks and returns the results that came back (stragglers may be missing), or their sum alone.
Train = Callable[[list[ClientTask]], Awaitable[list[ClientResult] | SecureSum]]
# Runs a CPU-bound hook call: the edge service passes asyncio.to_thread, so that building tasks and
# aggregating do not hold up its event loop (long-polls, health); in process, a plain call.
Offload = Callable[..., Awaitable[Any]]


async def _inline(fn: Callable[..., Any], *args: Any) -> Any:
    return fn(*args)


@dataclass(frozen=True)
class EdgeRoundOutcome:
    aggregate: EdgeAggregate
    edge_state: Record
    results: list[ClientResult]  # of every edge round, those its aggregate sums: for the history
    members: tuple[Member, ...] | None = None  # the devices it selected from (None: the simulated roster)


async def run_edge_round(
    algorithm: Algorithm, global_: Record, version: int, edge_id: int, edge_state: Record, train: Train,
    offload: Offload = _inline, members: list[Member] | None = None, busy: Collection[int] = (),
) -> EdgeRoundOutcome:
    """`members`: the run's devices at this edge for this round, which it selects from (those registered there
    for a run over registered devices; None: the simulated federation's, RunConfig.clients_of_edge). `busy`: those
    whose late answer is not in a contribution yet (policy.late = 'join', shared/core/late.py), left out."""
    config = algorithm.config
    pool = config.clients_of_edge(edge_id) if members is None else sorted(m.client_id for m in members)
    pool = [k for k in pool if k not in busy]
    kappa = config.topology.edge_rounds
    edge_global, all_results = global_, list[ClientResult]()
    for e in range(kappa):
        r = client_round(config, version, e)
        chosen = algorithm.select(pool, r, edge_id)
        trained = await train(await offload(_tasks, algorithm, edge_global, chosen, r))
        if isinstance(trained, SecureSum):  # the base edge_aggregate's sum, computed under masks
            results, aggregate = trained.results, EdgeAggregate(trained.sums, trained.weight)
        else:
            results = trained
            aggregate, edge_state = await offload(algorithm.edge_aggregate, results, edge_state, r, edge_id)
        all_results.extend(x for x in results if aggregate.clients is None or x.client_id in aggregate.clients)
        if e < kappa - 1:
            edge_global = await offload(algorithm.edge_round_update, edge_global, aggregate)
    if kappa > 1:
        aggregate = await offload(algorithm.edge_contribution, global_, edge_global, aggregate)
    # As it travels to the cloud (float32 sums, Algorithm.wire_spec): in the reference runner too.
    aggregate = replace(aggregate, tensors=algorithm.to_wire(aggregate.tensors))
    return EdgeRoundOutcome(aggregate, edge_state, all_results, None if members is None else tuple(members))


def device_seconds(config: RunConfig, client_id: int, num_samples: int, budget_s: float | None = None) -> float:
    """Client `client_id`'s modelled time for its local training: E epochs of its samples on its device
    (RunConfig.dvfs), in device seconds (an emulated device's wall time over dvfs.time_scale), at full speed, or
    given a task's DVFS budget at the frequencies its client picks to meet it (shared/core/pacing.py)."""
    _, profile, _ = config.dvfs.device(client_id)
    if budget_s is None:
        return config.local.epochs * epoch_seconds(profile, num_samples, profile.f_max)
    return paced_seconds(profile, num_samples, config.local.epochs, budget_s)


def first_answers(config: RunConfig, results: list[ClientResult], budget_s: float | None = None) -> list[ClientResult]:
    """The answers an edge round closes with when every selected device answers in its modelled time (given the
    round's DVFS budget, if any): all of them, or with policy.answers = K the K of least modelled time (ties: the
    lower client id), the others late (dropped, or joined to a later round: policy.late)."""
    k = config.policy.answers
    if k is None or k >= len(results):
        return results
    fastest = sorted(results, key=lambda r: (device_seconds(config, r.client_id, r.num_samples, budget_s),
                                             r.client_id))[:k]
    kept = {r.client_id for r in fastest}
    return [r for r in results if r.client_id in kept]


def _tasks(algorithm: Algorithm, global_: Record, chosen: list[int], round: int) -> list[ClientTask]:
    return [ClientTask(k, round, algorithm.client_task(global_, k, round)) for k in chosen]
