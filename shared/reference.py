"""The in-process reference runner: the services' round loop without HTTP, Redis or processes.

It calls the same algorithm hooks, selection and seeds as cloud/edge/client, so for a given config it
yields the same global model as a distributed run (up to float summation order).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from shared.algorithms import registry
from shared.algorithms.base import ClientResult, Contribution
from shared.config import RunConfig
from shared.data.datasets import load_federated
from shared.federation import evaluate_global, initial_model, local_job, select_clients
from shared.transport.tensors import Tensors


@dataclass
class RoundRecord:
    round: int
    version: int
    clients: list[int]
    train_loss: float
    test_loss: float
    test_accuracy: float
    elapsed_s: float


@dataclass
class ReferenceResult:
    global_state: Tensors
    history: list[RoundRecord] = field(default_factory=list)


def run_reference(config: RunConfig, rounds: int | None = None) -> ReferenceResult:
    algorithm = registry.create(config)
    data = load_federated(config.data, config.seed)
    global_ = algorithm.init_global(initial_model(config))
    cloud_state: Tensors = {}
    client_states: dict[int, Tensors] = {}
    edge_states: dict[int, Tensors] = {e: {} for e in range(config.topology.num_edges)}
    result = ReferenceResult(global_)
    start = time.perf_counter()
    for r in range(config.rounds if rounds is None else rounds):
        contributions, losses, participants = [], [], []
        for edge_id in range(config.topology.num_edges):
            chosen = select_clients(config, config.clients_of_edge(edge_id), r, edge_id)
            results = []
            for k in chosen:
                task = algorithm.client_task(global_, k, r)
                update = algorithm.local_update(
                    local_job(config, k, r, data.clients[k]), task, client_states.get(k, {})
                )
                client_states[k] = update.state
                results.append(ClientResult(k, update.num_samples, update.loss, update.tensors))
                losses.append((update.num_samples, update.loss))
            aggregate, edge_states[edge_id] = algorithm.edge_aggregate(results, edge_states[edge_id], r)
            contributions.append(Contribution(edge_id, r, aggregate.tensors, aggregate.weight))
            participants.extend(chosen)
        global_, cloud_state = algorithm.cloud_update(global_, contributions, cloud_state, r)
        ev = evaluate_global(config, algorithm, global_)
        n = sum(w for w, _ in losses)
        result.history.append(
            RoundRecord(
                round=r,
                version=r + 1,
                clients=sorted(participants),
                train_loss=sum(w * loss for w, loss in losses) / n,
                test_loss=ev.loss,
                test_accuracy=ev.accuracy,
                elapsed_s=time.perf_counter() - start,
            )
        )
        result.global_state = global_
    return result
