"""An edge's contribution: what the cloud checks before it may enter the buffer, and its submission.

A contribution must be one that this edge could have computed in this run: from its own clients, each
at most once per edge round, with a weight those clients can give (an edge that claimed a weight
of 1e-300 for ordinary sums would blow the next global model up to inf), and with the tensors the
algorithm expects. Anything else is refused before it is buffered, so it changes nothing.
"""
from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass

from fl_services.cloud.orchestrator import Orchestrator
from fl_services.cloud.storage import Store, SubmitOutcome
from fl_services.shared.core import late
from fl_services.shared.core.algorithms.base import Algorithm
from fl_services.shared.core.config import RunConfig
from fl_services.shared.core.federation import site_evaluation
from fl_services.shared.core.records import Record
from fl_services.shared.core.reports import ClientParticipation, EdgeContributionHeader
from fl_services.shared.core.secagg import sites
from fl_services.shared.core.tensors import InvalidContent


@dataclass(frozen=True)
class EdgeContribution:
    """A contribution as it arrived: its tensors and header, decoded from `blob` (what the buffer keeps)."""

    tensors: Record
    header: EdgeContributionHeader
    blob: bytes


async def submit(*, store: Store, orchestrator: Orchestrator, contribution: EdgeContribution) -> SubmitOutcome:
    """Buffers an admissible contribution (idempotent per idempotency key) and wakes the cloud loop; raises
    InvalidContent, with nothing buffered, for one its run cannot take, and MembersElsewhere (a storage Conflict)
    for one declaring devices another site holds."""
    header = contribution.header
    algorithm = orchestrator.algorithm(header.run_id, await store.config(header.run_id))
    # The global state's shapes alone (its header), not a copy of it. The check reads every value: on a
    # worker thread, so long-polls are answered meanwhile.
    global_ = await orchestrator.globals.layout(header.run_id)
    await asyncio.to_thread(check_contribution, algorithm, global_, header, contribution.tensors)
    # A run over registered devices holds each device at one site: the store keeps which, beside the buffer.
    members = [m.client_id for m in header.members or []] if algorithm.config.selection is not None else []
    outcome = await store.submit(header, contribution.blob, not algorithm.asynchronous(algorithm.config), members)
    orchestrator.notify()
    return outcome


def check_contribution(algorithm: Algorithm, global_: Record, header: EdgeContributionHeader,
                       tensors: Record) -> None:
    """Raises InvalidContent (HTTP 422) unless the contribution is admissible."""
    config = algorithm.config
    topology = config.topology
    if header.edge_id not in config.edge_ids():
        raise InvalidContent(f"edge {header.edge_id} is not part of this run ({topology.num_edges} edges)")
    if header.late and config.policy.late != "join":
        raise InvalidContent("this run drops late answers (policy.late 'drop'): a contribution carries no late part")
    tensors, parts = late.split(header, tensors)
    ids = [c.client_id for c in header.clients]
    members = _members(config, header)
    everyone = [*header.clients, *(c for p in header.late for c in p.clients)]
    foreign = sorted({c.client_id for c in everyone} - set(members))
    if foreign:
        raise InvalidContent(f"clients must be clients of edge {header.edge_id} (its members this round); not its "
                             f"clients: {foreign}")
    _check_samples(config, everyone, members)
    repeated = sorted(k for k, n in Counter(c.client_id for c in everyone).items() if n > topology.edge_rounds)
    if repeated:
        raise InvalidContent(f"a client appears at most once per edge round ({topology.edge_rounds}); "
                             f"more often: {repeated}{' (its late parts included)' if header.late else ''}")
    _check_weight(algorithm, header.clients, header.weight)
    _check_evaluation(config, header)
    if config.secure_aggregation.cloud:
        sites.check_masked(algorithm, global_, ids, tensors)
    else:
        algorithm.check_contribution(global_, ids, tensors, header.weight, header.edge_id,
                                     None if config.selection is None else len(members))
    for part in header.late:
        if part.base_version >= header.base_version:
            raise InvalidContent(f"a late part is of an earlier round than its contribution's (version "
                                 f"{header.base_version}), not of version {part.base_version}")
        _check_weight(algorithm, part.clients, part.weight)
        algorithm.check_contribution(global_, [c.client_id for c in part.clients], parts[part.base_version],
                                     part.weight, header.edge_id)


def _check_evaluation(config: RunConfig, header: EdgeContributionHeader) -> None:
    """A site's evaluation is its clients' weighted by samples, in a run that evaluates on its devices."""
    if config.evaluation == "cloud" and (header.evaluation is not None
                                         or any(c.evaluation is not None for c in header.clients)):
        raise InvalidContent("this run is evaluated on the cloud's test set only (evaluation 'cloud'): a "
                             "contribution carries no evaluation")
    if header.evaluation != site_evaluation(header.clients):
        raise InvalidContent(f"the site's evaluation {header.evaluation} is not the sample-weighted mean of its "
                             "clients' evaluations")


def _members(config: RunConfig, header: EdgeContributionHeader) -> dict[int, int | None]:
    """The members the edge declared for the round, with their sample counts where it knows them. Those of a
    simulated run (no selection) lie within its roster at that edge, which an edge that declares none is taken to
    have: that roster is the run's own (data.num_clients over topology.num_edges), not the edge's to widen."""
    declared = {m.client_id: m.num_samples for m in header.members} if header.members is not None else None
    if config.selection is not None:
        if declared is None:
            raise InvalidContent("a contribution to a run over registered devices declares the round's members")
        return declared
    roster = config.clients_of_edge(header.edge_id)
    if declared is None:
        return dict.fromkeys(roster)
    strangers = sorted(set(declared) - set(roster))
    if strangers:
        raise InvalidContent(f"members {strangers} are not in this run's roster at edge {header.edge_id}")
    return declared


def _check_samples(config: RunConfig, clients: list[ClientParticipation], members: dict[int, int | None]) -> None:
    """A client's counted samples: its declared count where the edge knows it, and at most the run's cap."""
    cap = config.max_samples_per_device
    for c in clients:
        known = members.get(c.client_id)
        if cap is not None and c.num_samples > cap:
            raise InvalidContent(f"client {c.client_id} counts {c.num_samples} samples, over the run's "
                                 f"max_samples_per_device {cap}")
        if known is not None and c.num_samples != min(known, cap or known):
            raise InvalidContent(f"client {c.client_id} counts {c.num_samples} samples; the edge declared it holds "
                                 f"{known}")


def _check_weight(algorithm: Algorithm, clients: list[ClientParticipation], weight: float) -> None:
    # The weight of some of the listed clients: all of them (FedAvg, pFedMe's S), or those of the last of
    # κ edge rounds; so between one client's weight and all of theirs.
    weights = [algorithm.client_weight(c.num_samples) for c in clients]
    low, high = min(weights), sum(weights)
    if not low * (1 - 1e-9) <= weight <= high * (1 + 1e-9):
        raise InvalidContent(f"weight {weight:.12g} is not one its clients give: expected between "
                             f"{low:.12g} (one client) and {high:.12g} (all of them)")
