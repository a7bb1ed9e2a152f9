"""The in-process reference runner: the services' round loop without HTTP, Redis or processes.

It runs the same edge round (shared/edge_round.py), the same algorithm hooks, selection and seeds as
cloud/edge/client, so for a given config it yields the same global model as a distributed run (up to
float summation order), and the same history records.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from datetime import datetime, timezone

from shared.algorithms import registry
from shared.algorithms.base import Algorithm, ClientResult, Contribution
from shared.config import RunConfig
from shared.data.datasets import load_federated
from shared.edge_round import ClientTask, run_edge_round
from shared.federation import evaluate_global, initial_model, local_job, participation, round_record
from shared.schemas import EdgeContributionHeader, RoundRecord
from shared.transport.tensors import Tensors


@dataclass
class ReferenceResult:
    global_state: Tensors
    history: list[RoundRecord] = field(default_factory=list)
    client_states: dict[int, Tensors] = field(default_factory=dict)


class _InProcessClients:
    """Trains tasks by calling local_update directly, keeping each client's state in a dict."""

    def __init__(self, algorithm: Algorithm):
        self.algorithm = algorithm
        self.data = load_federated(algorithm.config.data, algorithm.config.seed)
        self.states: dict[int, Tensors] = {}

    async def train(self, tasks: list[ClientTask]) -> list[ClientResult]:
        results = []
        for t in tasks:
            job = local_job(self.algorithm.config, t.client_id, t.round, self.data.clients[t.client_id])
            update = self.algorithm.local_update(job, t.tensors, self.states.get(t.client_id, {}))
            self.states[t.client_id] = update.state
            results.append(ClientResult(t.client_id, update.num_samples, update.loss, update.tensors, update.metrics))
        return results


def run_reference(config: RunConfig, rounds: int | None = None) -> ReferenceResult:
    return asyncio.run(_run(config, config.rounds if rounds is None else rounds))


async def _run(config: RunConfig, rounds: int) -> ReferenceResult:
    algorithm = registry.create(config)
    clients = _InProcessClients(algorithm)
    global_ = algorithm.init_global(initial_model(config))
    cloud_state: Tensors = {}
    edge_states: dict[int, Tensors] = {e: {} for e in range(config.topology.num_edges)}
    result = ReferenceResult(global_, client_states=clients.states)
    run_started = started = datetime.now(timezone.utc)
    for version in range(rounds):
        contributions, headers = [], []
        for edge_id in range(config.topology.num_edges):
            outcome = await run_edge_round(algorithm, global_, version, edge_id, edge_states[edge_id], clients.train)
            edge_states[edge_id] = outcome.edge_state
            ids = tuple(sorted({r.client_id for r in outcome.results}))
            contributions.append(Contribution(edge_id, version, outcome.aggregate.tensors, outcome.aggregate.weight, ids))
            headers.append(EdgeContributionHeader(
                run_id="reference", edge_id=edge_id, base_version=version, idempotency_key=f"{edge_id}:{version}",
                weight=outcome.aggregate.weight, clients=participation(outcome.results)))
        global_, cloud_state = algorithm.cloud_update(global_, contributions, cloud_state, version)
        finished = datetime.now(timezone.utc)
        evaluation = evaluate_global(config, algorithm, global_)
        result.history.append(round_record(version, headers, evaluation, started, run_started, finished))
        result.global_state, started = global_, finished
    return result
