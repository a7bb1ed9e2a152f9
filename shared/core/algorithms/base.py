"""The algorithm extension point.

An algorithm is one class in one file under `shared/core/algorithms/`. It provides pure hooks; an edge round
(shared/core/edge_round.py) and a cloud round (shared/core/cloud_round.py) are written once and called by the
services (edge/round_loop.py, cloud/orchestrator.py) and by the in-process reference runner
(shared/core/reference.py), so both call the same hooks in the same order:

    cloud:  init_global ............................................. version 0
    edge:   select(client_ids, round, edge) -> the clients that train this round
    edge:   client_task(global, k, round) -> the task record, per selected client   (sub-models go here)
    client: local_update(job, task, client_state) -> ClientUpdate   (result record + state kept per client)
    edge:   edge_aggregate(results, edge_state, round, edge_id) -> (EdgeAggregate, edge_state)   (a partial sum)
    edge:   [κ > 1 edge rounds: edge_round_update, then edge_contribution]
    cloud:  cloud_update(global, contributions, cloud_state, round) -> (new global, cloud_state)   (server memory,
            keyed by device: shared/core/roster.py)
    cloud:  evaluate, server_metrics(global, cloud_state) -> the round's figures for the history

Everything that crosses a process boundary is a `Record`: named groups of tensors such as
{"model": w, "control": c} (shared/core/records.py), plus typed metadata, so it travels as
safetensors and is stored as safetensors (client disk, Redis); only that codec flattens the groups.
State is declared by the hooks' signatures and kept by the services; an algorithm never does I/O itself.

An algorithm is generic over its Params model (`class FedProx(FedAvg[FedProxParams])`), so that
`self.params.mu` is typed; `Params` is read from that argument.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable, ClassVar, Collection, Generic, get_args

import torch
from pydantic import BaseModel, ConfigDict
from torch import nn
from typing_extensions import TypeVar

from fl_services.shared.core import records
from fl_services.shared.core.algorithms import aggregate
from fl_services.shared.core.config import ConfigError, RunConfig
from fl_services.shared.core.data import ClientData
from fl_services.shared.core.records import Record, RecordSpec
from fl_services.shared.core.reports import ClientFailure, ClientParticipation, DeviceReport, HeldOut, Member
from fl_services.shared.core.selection import select_clients
from fl_services.shared.core.tensors import MAX_ABS, Tensors
from fl_services.shared.core.training import Evaluation

MODEL = "model"  # the group holding the model's parameters (or a step of them)


class NoParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


P = TypeVar("P", bound=BaseModel, default=NoParams)


@dataclass(frozen=True)
class LocalJob:
    """What a client-side hook may use: its data, a fresh model of the run's architecture, its RNG."""

    client_id: int
    round: int
    data: ClientData
    model_factory: Callable[..., nn.Module]  # keywords narrow hidden layers (sub-models)
    generator: torch.Generator


@dataclass(frozen=True)
class ClientUpdate:
    """A client's answer: the record sent to the edge, plus the record it keeps for the next round."""

    tensors: Record
    num_samples: int
    loss: float
    state: Record = field(default_factory=dict)
    # Scalars reported with the result and averaged (by samples) into the round's history.
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class ClientResult:
    """A client's answer as the edge sees it."""

    client_id: int
    num_samples: int
    loss: float
    tensors: Record
    metrics: dict[str, float] = field(default_factory=dict)
    device: DeviceReport | None = None  # the DVFS model's account of the task (shared/core/dvfs.py)
    evaluation: HeldOut | None = None  # of the task's global model on the device's held-out split


@dataclass(frozen=True)
class EdgeAggregate:
    tensors: Record
    weight: float
    # The clients whose results it sums, when that is not every result (pFedMe's sample S): the round's
    # history lists the clients behind the model, so the edge reports only these.
    clients: tuple[int, ...] | None = None


@dataclass(frozen=True)
class Contribution:
    """An edge's aggregate as the cloud sees it."""

    edge_id: int
    base_version: int
    tensors: Record
    weight: float
    # The clients behind it, in id order, with what each reported (samples, loss, e.g. held-out accuracy):
    # what the round's history records of them.
    participation: tuple[ClientParticipation, ...] = ()
    # Its selected clients that reported they could not train (e.g. cannot import the run's model).
    failures: tuple[ClientFailure, ...] = ()
    # The devices the edge selected from, with their labels (a run over registered devices: they make its roster,
    # shared/core/roster.py); None: the simulated federation's roster at that edge.
    members: tuple[Member, ...] | None = None
    # The site's evaluation of base_version on its clients' held-out splits (federated evaluation), if any.
    evaluation: HeldOut | None = None
    # Late answers (policy.late = 'join'): the step of those computed on base_version that came with the edge's
    # contribution of a later round, weighed by their own staleness.
    joined: bool = False

    @property
    def clients(self) -> tuple[int, ...]:
        return tuple(c.client_id for c in self.participation)

    @property
    def metrics(self) -> dict[int, dict[str, float]]:
        return {c.client_id: dict(c.metrics) for c in self.participation}


class Algorithm(Generic[P]):
    name: ClassVar[str]
    Params: ClassVar[type[BaseModel]] = NoParams  # set from the class's generic argument
    params: P
    # Synchronous algorithms aggregate exactly one contribution per edge per version (B = L) and
    # refuse stale submissions; the asynchronous prototype algorithm overrides this.
    synchronous: ClassVar[bool] = True
    # Why a synchronous algorithm cannot also run with a buffer B < L, weighing a contribution computed on an older
    # global version by its staleness (shared/core/algorithms/staleness.py); None: it can. The default holds
    # for any rule not shown to take a stale step; FedAvg and its variants whose update is that step say None.
    stale_refusal: ClassVar[str | None] = ("its cloud update is defined only for contributions computed on the "
                                           "current global state")
    # Algorithms whose server memory spans all clients cannot be split over several edges.
    multi_edge: ClassVar[bool] = True
    # Whether an edge may run κ > 1 rounds with its own clients before it reports to the cloud.
    edge_rounds: ClassVar[bool] = False
    # Whether RunConfig.aggregation (robust aggregators) and .privacy (DP-FedAvg) apply: they replace the mean
    # of model steps, so only algorithms whose update is that mean take them (FedAvg, FedProx).
    robust_aggregation: ClassVar[bool] = False
    # Contribution groups that travel in the dtypes contribution_spec gives them. Every other float64 tensor of a
    # contribution travels as float32 (to_wire): see `wire_spec`.
    exact_wire_groups: ClassVar[frozenset[str]] = frozenset()
    # Whether the edge's aggregate is the plain weighted sum of the results (the base edge_aggregate), the one
    # thing secure aggregation lets an edge compute (RunConfig.secure_aggregation).
    secure_aggregation: ClassVar[bool] = False
    # Whether a device can evaluate the global model its task carries (RunConfig.evaluation "federated", "both"):
    # not where the task is a sub-model, or where the global state is not one model to test (own `evaluate`).
    federated_evaluation: ClassVar[bool] = True

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for base in cls.__dict__.get("__orig_bases__", ()):
            for arg in get_args(base):
                arg = getattr(arg, "__default__", arg)  # a class still generic in its Params: the default
                if isinstance(arg, type) and issubclass(arg, BaseModel):
                    cls.Params = arg

    def __init__(self, config: RunConfig):
        self.config = config
        self.params = self.Params.model_validate(config.params)  # type: ignore[assignment]

    @classmethod
    def check_config(cls, config: RunConfig) -> None:
        """Raises ValueError for configs this algorithm cannot run (a ConfigError where one field is the cause)."""
        sa = config.secure_aggregation
        if (sa.edge or sa.cloud) and not cls.secure_aggregation:
            raise ConfigError("secure_aggregation", f"{cls.name} needs each client's result at the edge (or each "
                              "site's at the cloud), which secure aggregation hides; "
                              + _those_that(lambda c: c.secure_aggregation, "take it", "takes it"))
        if sa.edge:
            if config.aggregation.edge != "mean":
                raise ConfigError("aggregation.edge", f"aggregation.edge = {config.aggregation.edge!r} needs every "
                                  "update at the edge, which secure aggregation hides: use 'mean' with "
                                  "secure_aggregation.edge")
            if config.privacy.noise == "edge":
                raise ConfigError("privacy.noise", "privacy.noise = 'edge' clips each update at the edge, which secure "
                                  "aggregation hides: use privacy.noise = 'client' (each device noises its own update)")
        if (cls.synchronous and cls.stale_refusal is not None
                and config.topology.buffer_size != config.topology.num_edges):
            raise ConfigError(
                "topology.buffer_size", f"{cls.name} is synchronous: topology.buffer_size must equal num_edges "
                f"({config.topology.num_edges}), got {config.topology.buffer_size}; a smaller buffer would "
                f"consume stale contributions, and {cls.stale_refusal}"
            )
        if config.topology.buffer_size > config.topology.num_edges:
            raise ConfigError("topology.buffer_size", f"topology.buffer_size ({config.topology.buffer_size}) cannot "
                              f"exceed num_edges ({config.topology.num_edges}): an edge has one contribution in the "
                              "buffer at a time")
        if config.policy.late == "join":
            cls._check_join(config)
        if not cls.multi_edge and config.topology.num_edges > 1:
            raise ConfigError("topology.num_edges", f"{cls.name} keeps global server memory and runs with one edge "
                              "only")
        if not cls.edge_rounds and config.topology.edge_rounds > 1:
            raise ConfigError("topology.edge_rounds", f"{cls.name} does not support topology.edge_rounds > 1")
        if config.evaluation != "cloud" and not cls.federated_evaluation:
            raise ConfigError("evaluation", f"{cls.name} does not support federated evaluation (evaluation must be "
                              "'cloud'): its devices do not receive the global model as one model to test")
        if not cls.robust_aggregation:
            agg = config.aggregation
            if agg.edge != "mean" or agg.cloud != "mean":
                raise ConfigError("aggregation.edge" if agg.edge != "mean" else "aggregation.cloud",
                                  f"{cls.name} does not support robust aggregation (aggregation.edge and .cloud "
                                  "must be 'mean'); " + _those_that(lambda c: c.robust_aggregation, "do", "does"))
            if config.privacy.noise != "off":
                raise ConfigError("privacy.noise", f"{cls.name} does not support differential privacy (privacy.noise "
                                  "must be 'off'); " + _those_that(lambda c: c.robust_aggregation, "do", "does"))
            if config.privacy.dp_sgd_noise_multiplier is not None:
                raise ConfigError("privacy.dp_sgd_noise_multiplier", f"{cls.name} does not support DP-SGD "
                                  "(privacy.dp_sgd_noise_multiplier must be unset); fedavg does")

    @classmethod
    def _check_join(cls, config: RunConfig) -> None:
        """policy.late = 'join' sends a late answer's step with the edge's next contribution, weighed by the cloud as
        one computed on its own version: only where that step is what the cloud averages, alone and in the open."""
        why = None
        if config.policy.answers is None:
            why = "it needs policy.answers = K: a round that waits for every answer has no late one"
        elif not cls.synchronous or cls.stale_refusal is not None:
            why = (f"{cls.name} cannot weigh a step computed on an older version by its staleness; "
                   + _those_that(lambda c: c.synchronous and c.stale_refusal is None, "can", "can"))
        elif config.topology.edge_rounds > 1:
            why = ("with topology.edge_rounds > 1 a round's answers are steps on the edge's own model, which a late "
                   "one misses")
        elif config.aggregation.edge != "mean" or config.aggregation.cloud != "mean":
            why = ("robust aggregation counts each device (aggregation.edge) or each site (aggregation.cloud) once per "
                   "round, which a late step counted with a later round's breaks: use 'mean'")
        elif config.privacy.noise != "off" or config.privacy.dp_sgd_noise_multiplier is not None:
            why = "differential privacy accounts each device's step in its own round, not in a later one"
        elif config.secure_aggregation.edge or config.secure_aggregation.cloud:
            why = ("secure aggregation's masks cancel only within the round whose devices made them: a late device's "
                   "masked step cannot join another round's sum")
        elif config.selection is not None:
            why = "a run over registered devices declares each round's members, which a late answer is not"
        elif config.evaluation != "cloud":
            why = ("a late device's held-out evaluation is of an older version than its site's record: use "
                   "evaluation 'cloud'")
        if why is not None:
            raise ConfigError("policy.late", f"policy.late = 'join' does not apply here: {why}")

    @classmethod
    def asynchronous(cls, config: RunConfig) -> bool:
        """Whether the run's cloud takes contributions computed on an older global version: always for an
        asynchronous algorithm, and for a synchronous one with a buffer B < L (buffered averaging)."""
        return not cls.synchronous or config.topology.buffer_size < config.topology.num_edges

    # ---- cloud ---------------------------------------------------------------------------------
    def init_global(self, model: nn.Module) -> Record:
        return {MODEL: {name: p.detach().clone() for name, p in model.named_parameters()}}

    def model_parameters(self, global_: Record) -> Tensors:
        """The part of the global state that is the model to evaluate and download."""
        return global_[MODEL]

    def contribution_spec(self, global_: Record, clients: list[int]) -> RecordSpec:
        """What an edge must submit for `global_` on behalf of `clients`: checked before buffering."""
        return {group: {name: (tuple(t.shape), torch.float64) for name, t in members.items()}
                for group, members in global_.items()}

    def wire_spec(self, spec: RecordSpec) -> RecordSpec:
        """`spec` (a contribution_spec) as the contribution travels from edge to cloud: its float64 tensors as
        float32, but in `exact_wire_groups`. An edge accumulates in float64 so that the grouping of clients
        into edges barely moves the sum; the sum itself, rounded once to float32 (a relative error of 2⁻²⁴
        of each summed value, no cancellation left to amplify it), then moves the float32 model it is
        applied to by at most about one rounding of the step: half the bytes of float64 for nothing."""
        return {group: {name: (shape, torch.float32 if dtype == torch.float64 and group not in self.exact_wire_groups
                               else dtype) for name, (shape, dtype) in members.items()}
                for group, members in spec.items()}

    def to_wire(self, tensors: Record) -> Record:
        """What an edge sends of its aggregate: its float64 tensors as float32, but in `exact_wire_groups`."""
        return {group: {name: t.to(torch.float32) if t.dtype == torch.float64 and group not in self.exact_wire_groups
                        else t for name, t in members.items()}
                for group, members in tensors.items()}

    def from_wire(self, global_: Record, contribution: Contribution) -> Contribution:
        """A contribution as it arrived (to_wire's dtypes) in the dtypes of contribution_spec, exactly:
        what cloud_update computes with (float64 sums)."""
        spec = self.contribution_spec(global_, list(contribution.clients))
        widened = {group: {name: t.to(torch.float64) if t.dtype == torch.float32
                           and spec.get(group, {}).get(name, ((), t.dtype))[1] == torch.float64 else t
                           for name, t in members.items()}
                   for group, members in contribution.tensors.items()}
        return replace(contribution, tensors=widened)

    def check_contribution(self, global_: Record, clients: list[int], tensors: Record, weight: float,
                           edge_id: int | None = None, population: int | None = None) -> None:
        """Raises InvalidContent (HTTP 422) unless `tensors` is a valid contribution of edge `edge_id`
        with total weight `weight`, as it travels (wire_spec): groups, names, shapes, dtypes and finiteness,
        and, since a contribution carries weighted sums Σ w_k x_k, means (sums / weight) within ±MAX_ABS.
        `population`: the devices the edge declared as its members (None: its simulated roster)."""
        records.check(tensors, self.wire_spec(self.contribution_spec(global_, clients)))
        records.check_magnitude(tensors, MAX_ABS * weight)

    def cloud_update(
        self, global_: Record, contributions: list[Contribution], cloud_state: Record, round: int
    ) -> tuple[Record, Record]:
        raise NotImplementedError

    def server_memory_bytes(self, global_: Record) -> int:
        """The most cloud state (server memory) the run will keep, in bytes: checked when the run is
        created, against what one Redis value can hold."""
        return 0

    def evaluate(self, global_: Record, cloud_state: Record) -> Evaluation | None:
        """The round's figures when the global state is not one model to test centrally (None: it is)."""
        return None

    def server_metrics(self, global_: Record, cloud_state: Record) -> dict[str, float]:
        """Figures the cloud computes after an update, recorded in the round's history (`server_metrics`)."""
        return {}

    # ---- edge ----------------------------------------------------------------------------------
    def select(self, client_ids: list[int], round: int, edge_id: int) -> list[int]:
        return select_clients(self.config, client_ids, round, edge_id)

    def client_task(self, global_: Record, client_id: int, round: int) -> Record:
        return global_

    def result_spec(self, task: Record) -> RecordSpec:
        """What a client must send back for `task`: checked by the edge before it accepts a result."""
        return records.spec_of(task)

    def check_result(self, task: Record, tensors: Record) -> None:
        """Raises InvalidContent unless `tensors` is a valid answer to `task` (checked by the edge)."""
        # Finite and within bounds in one pass over the values: a second pass would double an edge's check.
        records.check(tensors, self.result_spec(task), MAX_ABS)

    def client_group(self, client_id: int) -> str:
        """How reports group clients (prototype learning: the client's model family)."""
        return "all"

    def client_weight(self, num_samples: int) -> float:
        return float(num_samples) if self.config.weighting == "samples" else 1.0

    def edge_aggregate(
        self, results: list[ClientResult], edge_state: Record, round: int, edge_id: int | None = None
    ) -> tuple[EdgeAggregate, Record]:
        """`edge_id`: the aggregating edge (what seeds its draws: pFedMe's sample, DP noise); None: the simulated
        roster's binding, client k at edge k mod L."""
        ordered = sorted(results, key=lambda r: r.client_id)
        partial = aggregate.reduce((self.client_weight(r.num_samples), r.tensors) for r in ordered)
        return EdgeAggregate(partial.sums, partial.weight), edge_state

    def edge_round_update(self, edge_global: Record, aggregate: EdgeAggregate) -> Record:
        """The edge's own model after one of κ edge rounds (only with edge_rounds = True)."""
        raise NotImplementedError

    def edge_contribution(self, global_: Record, edge_global: Record, aggregate: EdgeAggregate) -> EdgeAggregate:
        """What the edge submits after its last edge round, relative to the cloud's `global_`."""
        raise NotImplementedError

    # ---- client --------------------------------------------------------------------------------
    def local_update(self, job: LocalJob, task: Record, state: Record) -> ClientUpdate:
        raise NotImplementedError


def _those_that(holds: Callable[[type[Algorithm[Any]]], bool], verb: str, verb_one: str) -> str:
    """The registered algorithms for which `holds` is true, as a refusal names them ("fedavg, fedprox and fedsgd
    take it"): read from their classes' flags, so a new algorithm is named without another list to keep."""
    from fl_services.shared.core.algorithms import registry  # here: the registry imports this module

    names = [name for name in registry.available() if holds(registry.get_algorithm_class(name))]
    if not names:
        return f"no algorithm {verb_one}"
    listed = names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"
    return f"{listed} {verb_one if len(names) == 1 else verb}"


def combined_mean(contributions: list[Contribution], groups: Collection[str] | None = None) -> Record:
    """Mean over all clients behind `contributions` (p_k-weighted), in float64: of every group, or of `groups`
    (those that are partial sums, when a contribution also carries per-client tensors)."""
    ordered = sorted(contributions, key=lambda c: c.edge_id)
    return aggregate.mean(aggregate.combine(
        aggregate.Partial({g: t for g, t in c.tensors.items() if groups is None or g in groups}, c.weight)
        for c in ordered))
