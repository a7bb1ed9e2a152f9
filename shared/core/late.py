"""Late answers that join an edge's next contribution (RoundPolicy.late = 'join'), written once for the edge service,
the cloud and the reference runner.

An edge round closed at its K-th answer (policy.answers) leaves its other tasks open. An answer that comes later is
kept and sent with the edge's next contribution, as its own part: the weighted sum and weight of the late answers
computed on each base version v, so that the cloud weighs each part by s(t − v) as it weighs a whole contribution
of version v (shared/core/algorithms/staleness.py). A device whose late answer has not been sent yet is given no
task meanwhile, so at most one of its steps is ever in flight, and which devices an edge round trains follows from
the history alone (the reference runner replays it).

On the wire a part is the groups of the contribution's record named `<group>@<v>`, listed in the header's `late`
(reports.LatePart: v, the part's weight, its clients): one safetensors file still carries the whole contribution.
"""
from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from fl_services.shared.core.algorithms.base import Algorithm, ClientResult, Contribution, EdgeAggregate
from fl_services.shared.core.config import RunConfig
from fl_services.shared.core.federation import client_round, contribution, participation
from fl_services.shared.core.records import Record
from fl_services.shared.core.reports import EdgeContributionHeader, LatePart
from fl_services.shared.core.tensors import InvalidContent

MARK = "@"


@dataclass(frozen=True)
class LateAnswer:
    """A device's answer to a task of an edge round that had closed before it came."""

    base_version: int
    result: ClientResult


@dataclass(frozen=True)
class LateAggregate:
    """The late answers computed on one base version, aggregated as that version's edge round would have."""

    base_version: int
    aggregate: EdgeAggregate  # in the wire's dtypes (Algorithm.to_wire)
    results: list[ClientResult]

    def part(self) -> LatePart:
        return LatePart(base_version=self.base_version, weight=self.aggregate.weight,
                        clients=participation(self.results))


async def aggregates(algorithm: Algorithm, late: list[LateAnswer], edge_id: int,
                     offload: Callable[..., Awaitable[Any]] | None = None) -> list[LateAggregate]:
    """The late answers' parts, by base version (oldest first), each summed as its own round would have summed it
    (the algorithm's edge_aggregate; `offload` runs that call, as in shared/core/edge_round.py)."""
    parts = []
    for version in sorted({a.base_version for a in late}):
        results = sorted((a.result for a in late if a.base_version == version), key=lambda r: r.client_id)
        args: tuple[Any, ...] = (results, {}, client_round(algorithm.config, version, 0), edge_id)
        aggregate, _ = (await offload(algorithm.edge_aggregate, *args) if offload is not None
                        else algorithm.edge_aggregate(*args))
        aggregate = EdgeAggregate(algorithm.to_wire(aggregate.tensors), aggregate.weight)
        parts.append(LateAggregate(version, aggregate, results))
    return parts


def merged(tensors: Record, parts: list[LateAggregate]) -> Record:
    """The contribution's record with its late parts' groups."""
    return {**tensors, **{f"{group}{MARK}{p.base_version}": members
                          for p in parts for group, members in p.aggregate.tensors.items()}}


def split(header: EdgeContributionHeader, tensors: Record) -> tuple[Record, dict[int, Record]]:
    """A contribution's own groups, and each late part's by its base version; raises InvalidContent for parts the
    header does not list, or lists twice."""
    versions = [p.base_version for p in header.late]
    if len(set(versions)) != len(versions):
        raise InvalidContent(f"late parts list a base version more than once: {sorted(versions)}")
    own = {g: members for g, members in tensors.items() if MARK not in g}
    parts: dict[int, Record] = {v: {} for v in versions}
    for group, members in tensors.items():
        if MARK not in group:
            continue
        name, _, version = group.rpartition(MARK)
        if not version.isdigit() or int(version) not in parts:
            raise InvalidContent(f"tensor group {group!r} is no late part the header lists ({versions})")
        parts[int(version)][name] = members
    return own, parts


def contributions(config: RunConfig, header: EdgeContributionHeader, tensors: Record) -> list[Contribution]:
    """An accepted contribution as the cloud's update weighs it: the edge's own, then one per late part."""
    own, parts = split(header, tensors)
    return [contribution(config, header, own),
            *(Contribution(header.edge_id, p.base_version, parts[p.base_version], p.weight, tuple(p.clients),
                           joined=True) for p in header.late)]
