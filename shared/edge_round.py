"""One global round as an edge runs it, written once for the edge service and the reference runner.

The edge trains its selected clients on the global state (κ = 1), or runs κ edge rounds on its own
edge model before it reports (hierarchical FedAvg). How clients are trained is the caller's: the edge
service dispatches tasks over HTTP and waits, the reference runner calls `local_update` in-process.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Awaitable, Callable

from shared.algorithms.base import Algorithm, ClientResult, EdgeAggregate
from shared.federation import client_round
from shared.transport.tensors import Tensors


@dataclass(frozen=True)
class ClientTask:
    client_id: int
    round: int
    tensors: Tensors


# Trains the given tasks and returns the results that came back (stragglers may be missing).
Train = Callable[[list[ClientTask]], Awaitable[list[ClientResult]]]


@dataclass(frozen=True)
class EdgeRoundOutcome:
    aggregate: EdgeAggregate
    edge_state: Tensors
    results: list[ClientResult]  # of every edge round, for the history


async def run_edge_round(
    algorithm: Algorithm, global_: Tensors, version: int, edge_id: int, edge_state: Tensors, train: Train
) -> EdgeRoundOutcome:
    config = algorithm.config
    kappa = config.topology.edge_rounds
    edge_global, all_results = global_, []
    for e in range(kappa):
        r = client_round(config, version, e)
        chosen = algorithm.select(config.clients_of_edge(edge_id), r, edge_id)
        results = await train([ClientTask(k, r, algorithm.client_task(edge_global, k, r)) for k in chosen])
        all_results.extend(results)
        aggregate, edge_state = algorithm.edge_aggregate(results, edge_state, r)
        if e < kappa - 1:
            edge_global = algorithm.edge_round_update(edge_global, aggregate)
    if kappa > 1:
        aggregate = algorithm.edge_contribution(global_, edge_global, aggregate)
    return EdgeRoundOutcome(aggregate, edge_state, all_results)
