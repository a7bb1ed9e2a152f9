"""The in-process reference runner: the services' round loop without HTTP, Redis or processes.

It runs the same edge round (shared/core/edge_round.py) and cloud round (shared/core/cloud_round.py, which raises
Diverged on a non-finite model), the same algorithm hooks, selection and seeds as cloud/edge/client, so
for a given config it yields the same global model as a distributed run (up to float summation order),
and the same history records, except that a record lists its contributions in the order its buffer
received them, which in a service run is the order the edges happened to submit.

Which edge triples each cloud update consumes is the one thing timing decides. Synchronous algorithms
(B = L) consume every edge's triple each time. With B < L (an asynchronous algorithm, or FedAvg's buffered
averaging) the runner either replays a `schedule` (the (edge, base_version) pairs of each update, e.g. read
from a service run's history) or simulates virtual time: an edge round of edge l takes `edge_slowdown[l]`
units (1 by default), or, with `device_time`, `edge_slowdown[l]` times the modelled time of the slowest client
it closes with (the DVFS device model, shared/core/dvfs.py: the emulated devices' wall time over
dvfs.time_scale), each client at the frequencies its DVFS policy picks for the budget the edge's pacing gives it
(shared/core/pacing.py, fed by the modelled times and buffer waits; full speed with policy 'max'; transfers are
not modelled); triples enter the buffer in order of completion (ties by edge id), and an edge restarts
on the version its triple produced, as the services' edges do. With policy.late = 'join' a late answer joins its
edge's first round that closes after it came (shared/core/late.py), or, replaying, the one the history says.

A run over registered devices (RunConfig.selection) is replayed given its `devices`: each with its id, the edge
(site) it registered at, its data source, its labels and the version from which it is registered (its join, in
rounds: a device registering during round v is a member from round v + 1, so it joins at v + 1). An edge's members
in the round on version v are its devices joined by v whose labels the selection's device selector takes, which is
what the edge service selects from and declares; `joins_of` reads the joins back from a service run's history.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from datetime import datetime, timezone

from fl_services.shared.core import late
from fl_services.shared.core.algorithms import privacy, registry
from fl_services.shared.core.algorithms.base import Algorithm, ClientResult, Contribution
from fl_services.shared.core.cloud_round import round_record, run_cloud_round
from fl_services.shared.core.config import RunConfig, matches
from fl_services.shared.core.data import ClientData, load_federated, open_source
from fl_services.shared.core.edge_round import (
    ClientTask,
    EdgeRoundOutcome,
    device_seconds,
    first_answers,
    run_edge_round,
)
from fl_services.shared.core.federation import (
    evaluate_held_out,
    initial_model,
    local_job,
    participation,
    site_evaluation,
)
from fl_services.shared.core.pacing import Pacing
from fl_services.shared.core.records import Record
from fl_services.shared.core.reports import Member, RoundRecord
from fl_services.shared.core.tensors import Tensors

# One cloud update's buffer: (edge_id, base_version) per triple.
Schedule = list[list[tuple[int, int]]]
# Late answers joined to a contribution (policy.late = 'join'): per (edge_id, base_version) of the contribution that
# carried them, each part's (base_version, client ids).
Joins = dict[tuple[int, int], list[tuple[int, list[int]]]]


@dataclass(frozen=True)
class Device:
    """A device registered for a run over registered devices, as the reference runner replays it."""

    client_id: int
    edge_id: int  # the edge (site) it registered at
    data: str  # its data source spec (shared/core/data/specs.py), e.g. "partition:digits?clients=6&index=2"
    labels: dict[str, str] = field(default_factory=dict)
    joins: int = 0  # the first version whose edge round has it as a member


@dataclass
class ReferenceResult:
    global_state: Tensors  # the model as the REST API serves it (Algorithm.model_parameters)
    global_record: Record  # the whole global state
    history: list[RoundRecord] = field(default_factory=list)
    client_states: dict[int, Record] = field(default_factory=dict)
    cloud_state: Record = field(default_factory=dict)
    # Per update, in virtual time: when it happened (the last of its contributions in), and how many client tasks
    # the edges had set by then, answered or not (what a benchmark counts as client work).
    virtual_times: list[float] = field(default_factory=list)
    client_tasks: list[int] = field(default_factory=list)


class InProcessClients:
    """Trains tasks by calling local_update directly, keeping each client's state in a dict. A benchmark may
    pass a subclass to `run_reference` (e.g. bench/robust.py's clients that poison their updates)."""

    def __init__(self, algorithm: Algorithm, devices: list[Device] | None = None):
        self.algorithm = algorithm
        self.data = load_federated(algorithm.config.data, algorithm.config.seed)
        self.states: dict[int, Record] = {}
        self.sources = {d.client_id: d.data for d in devices or []}
        self._own: dict[int, ClientData] = {}

    def client_data(self, client_id: int) -> ClientData:
        """What client `client_id` trains on: its device's own source, else its partition of the run's data."""
        if client_id not in self.sources:
            return self.data.clients[client_id]
        if client_id not in self._own:
            self._own[client_id] = ClientData(*open_source(self.sources[client_id]).load())
        return self._own[client_id]

    async def train(self, tasks: list[ClientTask]) -> list[ClientResult]:
        results = []
        for t in tasks:
            job = local_job(self.algorithm.config, t.client_id, t.round, self.client_data(t.client_id))
            evaluation = evaluate_held_out(self.algorithm, job, t.tensors)
            update = self.algorithm.local_update(job, t.tensors, self.states.get(t.client_id, {}))
            self.states[t.client_id] = update.state
            results.append(ClientResult(t.client_id, update.num_samples, update.loss, update.tensors, update.metrics,
                                        evaluation=evaluation))
        return results


@dataclass
class _Pending:
    base_version: int
    outcome: EdgeRoundOutcome
    done_at: float
    late: list[late.LateAggregate] = field(default_factory=list)  # the late answers it carries


@dataclass(frozen=True)
class _Late:
    answer: late.LateAnswer
    done_at: float  # when it came, in virtual time


def run_reference(config: RunConfig, rounds: int | None = None, *, schedule: Schedule | None = None,
                  edge_slowdown: dict[int, float] | None = None, device_time: bool = False,
                  clients: type[InProcessClients] = InProcessClients,
                  devices: list[Device] | None = None, joined: Joins | None = None) -> ReferenceResult:
    """`devices`: a run over registered devices' devices (config.selection), which it needs and only it takes.
    `joined`: with a `schedule` of a run whose late answers join later rounds (policy.late = 'join'), which joined
    which (`joined_of`); in virtual time, a late answer joins its edge's first round that closes after it came."""
    rounds = privacy.rounds_to_run(config) if rounds is None else rounds
    if schedule is not None and len(schedule) < rounds:
        raise ValueError(f"the schedule covers {len(schedule)} updates, not {rounds}")
    if (schedule is not None and config.policy.late == "join") != (joined is not None):
        raise ValueError("a schedule of a run whose late answers join later rounds (policy.late 'join') is replayed "
                         "given which joined which (joined_of), and only it")
    if (devices is None) != (config.selection is None):
        raise ValueError("a run over registered devices (selection) is replayed given its devices, and only it")
    strangers = sorted({d.edge_id for d in devices or []} - set(config.edge_ids()))
    if strangers:
        raise ValueError(f"devices registered at edges {strangers}, which are not the run's {config.edge_ids()}")
    return asyncio.run(_run(config, rounds, schedule, edge_slowdown or {}, device_time, clients, devices, joined))


def members_at(config: RunConfig, devices: list[Device], edge_id: int, version: int) -> list[Member]:
    """The run's members at edge `edge_id` in its round on `version`: its devices joined by then that the device
    selector takes, by id (edge/membership.py's, for devices whose data fits)."""
    assert config.selection is not None
    return [Member(client_id=d.client_id, labels=d.labels)
            for d in sorted(devices, key=lambda d: d.client_id)
            if d.edge_id == edge_id and d.joins <= version and matches(d.labels, config.selection.device_selector)]


def joins_of(history: list[RoundRecord]) -> dict[int, int]:
    """Each device's join (the first base version whose contribution declares it a member) in a run over
    registered devices' history."""
    joins: dict[int, int] = {}
    for record in history:
        for c in record.contributions:
            for k in c.members or []:
                joins[k] = min(joins.get(k, c.base_version), c.base_version)
    return joins


def schedule_of(history: list[RoundRecord]) -> Schedule:
    """The buffers a (service) run consumed, in its order, for `run_reference(schedule=...)`."""
    return [[(c.edge_id, c.base_version) for c in record.contributions if not c.joined] for record in history]


def joined_of(history: list[RoundRecord]) -> Joins:
    """Which late answers joined which contribution in a run with policy.late = 'join', for
    `run_reference(joined=...)`: a joined part follows its edge's contribution in its record."""
    joins: Joins = {}
    for record in history:
        carrier: dict[int, int] = {}
        for c in record.contributions:
            if c.joined:
                joins.setdefault((c.edge_id, carrier[c.edge_id]), []).append((c.base_version, list(c.clients or [])))
            else:
                carrier[c.edge_id] = c.base_version
    return joins


async def _run(config: RunConfig, rounds: int, schedule: Schedule | None, slowdown: dict[int, float],
               device_time: bool, clients_type: type[InProcessClients],
               devices: list[Device] | None, joined: Joins | None) -> ReferenceResult:
    algorithm = registry.create(config)
    clients = clients_type(algorithm) if devices is None else clients_type(algorithm, devices)
    globals_ = [algorithm.init_global(initial_model(config))]
    edge_states: dict[int, Record] = {e: {} for e in config.edge_ids()}
    pending: dict[int, _Pending] = {}
    tasks_set = [0]  # client tasks the edges have set so far
    # Per edge, the late answers not in a contribution yet, by client (policy.late = 'join'): those devices are busy.
    outstanding: dict[int, dict[int, _Late]] = {e: {} for e in config.edge_ids()}

    # Per edge, its DVFS pacing in virtual time (device_time): each task's budget, and so its device's frequencies.
    pacing = {e: Pacing() for e in config.edge_ids()}

    async def start(edge_id: int, version: int, now: float) -> None:
        members = None if devices is None else members_at(config, devices, edge_id, version)
        answered: list[ClientResult] = []
        chosen: list[int] = []
        budget: list[float | None] = [None]

        async def train(tasks: list[ClientTask]) -> list[ClientResult]:
            # Of each edge round; what is kept is the last one's (policy.late = 'join' takes κ = 1).
            tasks_set[0] += len(tasks)
            chosen[:] = [t.client_id for t in tasks]
            budget[0] = pacing[edge_id].budget(config, chosen) if device_time else None
            answered[:] = await clients.train(tasks)
            return first_answers(config, answered, budget[0])

        def seconds(result: ClientResult) -> float:
            return device_seconds(config, result.client_id, result.num_samples, budget[0]) if device_time else 1.0

        outcome = await run_edge_round(algorithm, globals_[version], version, edge_id, edge_states[edge_id],
                                       train, members=members, busy=set(outstanding[edge_id]))
        edge_states[edge_id] = outcome.edge_state
        slow = slowdown.get(edge_id, 1.0)
        took = max((seconds(r) for r in outcome.results), default=0.0) if device_time else 1.0
        if device_time:
            pacing[edge_id].observed(config, chosen, {
                r.client_id: (device_seconds(config, r.client_id, r.num_samples), seconds(r)) for r in outcome.results})
        round_ = _Pending(version, outcome, now + slow * took)
        if config.policy.late == "join":
            round_.late = await late.aggregates(algorithm, _joining(outstanding[edge_id], round_, edge_id, joined),
                                                edge_id)
            kept = {r.client_id for r in outcome.results}
            outstanding[edge_id].update({r.client_id: _Late(late.LateAnswer(version, r), now + slow * seconds(r))
                                         for r in answered if r.client_id not in kept})
        pending[edge_id] = round_

    result = ReferenceResult(algorithm.model_parameters(globals_[0]), globals_[0], client_states=clients.states)
    run_started = started = datetime.now(timezone.utc)
    now = 0.0
    if schedule is None:
        for edge_id in config.edge_ids():
            await start(edge_id, 0, now)
    for version in range(rounds):
        if schedule is None:
            arrived = sorted(pending, key=lambda e: (pending[e].done_at, e))[: config.topology.buffer_size]
        else:
            arrived = [edge_id for edge_id, _ in schedule[version]]
            for edge_id, base in schedule[version]:
                if edge_id not in pending or pending[edge_id].base_version != base:
                    if base > version:
                        raise ValueError(f"update {version} cannot consume a triple computed on version {base}")
                    await start(edge_id, base, now)
        consumed = [pending.pop(e) for e in arrived]
        now = max([now, *(p.done_at for p in consumed)])
        if len(consumed) > 1:  # how long each waited in the buffer for the others (DVFS slack, cloud.orchestrator)
            for e, p in zip(arrived, consumed, strict=True):
                pacing[e].waited(max(o.done_at for o in consumed if o is not p) - p.done_at)
        contributions = [
            c for e, p in zip(arrived, consumed, strict=True)
            for clients in [tuple(participation(p.outcome.results))]
            for c in [Contribution(e, p.base_version, p.outcome.aggregate.tensors, p.outcome.aggregate.weight,
                                   clients, members=p.outcome.members, evaluation=site_evaluation(clients)),
                      *(Contribution(e, a.base_version, a.aggregate.tensors, a.aggregate.weight,
                                     tuple(participation(a.results)), joined=True) for a in p.late)]
        ]
        outcome = run_cloud_round(algorithm, globals_[version], contributions, result.cloud_state, version)
        finished = datetime.now(timezone.utc)
        result.history.append(round_record(version, contributions, outcome, started, run_started, finished,
                                           config.dvfs.modelled))
        result.virtual_times.append(now)
        result.client_tasks.append(tasks_set[0])
        globals_.append(outcome.global_)
        result.global_state, result.global_record = algorithm.model_parameters(outcome.global_), outcome.global_
        result.cloud_state, started = outcome.cloud_state, finished
        if schedule is None and version + 1 < rounds:
            for e in arrived:
                await start(e, version + 1, now)
    return result


def _joining(outstanding: dict[int, _Late], round_: _Pending, edge_id: int,
             joined: Joins | None) -> list[late.LateAnswer]:
    """The late answers `round_`'s contribution carries, taken out of `outstanding`: those `joined` says (a replay),
    else those that came by the time it closed."""
    if joined is None:
        chosen = [k for k, a in outstanding.items() if a.done_at <= round_.done_at]
    else:
        chosen = []
        for version, ids in joined.get((edge_id, round_.base_version), []):
            missing = [k for k in ids if k not in outstanding or outstanding[k].answer.base_version != version]
            if missing:
                raise ValueError(f"edge {edge_id}'s contribution of version {round_.base_version} carries late answers "
                                 f"of version {version} from clients {missing}, which have none outstanding")
            chosen += ids
    return [outstanding.pop(k).answer for k in sorted(chosen)]
