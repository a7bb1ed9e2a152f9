"""The run's devices: N in the seed's equations (docs/decisions/memories-keyed-by-device.md).

A simulated run's devices are its roster 0 … N−1 (data.num_clients), fixed. A run over registered devices
(RunConfig.selection) has those its edges declared as members so far: a device is registered for the run from the
first round an edge declares it (Contribution.members), and stays so (one that leaves is a dropout: it keeps its
memory and its share of N). The cloud keeps that roster in the cloud state's "roster" group, in order of joining
(devices joining in the same update by id), so that a memory keyed by device grows by appending slots: slot i of
such a memory is the device roster[i], and a memory stored before a device joined is a prefix of the new one.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

from fl_services.shared.core.algorithms.base import Contribution
from fl_services.shared.core.config import RunConfig
from fl_services.shared.core.records import Record
from fl_services.shared.core.selection import num_selected

ROSTER = "roster"  # the cloud state's group: IDS, the run's devices in order of joining
IDS = "ids"


def devices(config: RunConfig, cloud_state: Record) -> list[int]:
    """The run's devices (N = their number) as of `cloud_state`: in order of joining."""
    if config.selection is None:
        return list(range(config.data.num_clients))
    ids = cloud_state.get(ROSTER, {}).get(IDS)
    return [] if ids is None else [int(k) for k in ids.tolist()]


def slots(config: RunConfig, cloud_state: Record) -> dict[int, int]:
    """Each device's slot in a memory keyed by device: its position in the roster."""
    return {k: i for i, k in enumerate(devices(config, cloud_state))}


def members(config: RunConfig, contribution: Contribution) -> list[int]:
    """The devices the contribution's edge selected from: those it declared, else its simulated roster."""
    if contribution.members is None:
        return config.clients_of_edge(contribution.edge_id)
    return sorted(m.client_id for m in contribution.members)


def joined(config: RunConfig, cloud_state: Record, contributions: Sequence[Contribution]) -> Record:
    """`cloud_state` with the roster grown by the members of `contributions` it did not hold yet (a run over
    registered devices; a simulated run's roster is its config's, and its state is returned as it is)."""
    if config.selection is None:
        return cloud_state
    known = devices(config, cloud_state)
    seen = set(known)
    new = sorted({k for c in contributions for k in members(config, c)} - seen)
    return {**cloud_state, ROSTER: {IDS: torch.tensor(known + new, dtype=torch.int64)}}


def kept(config: RunConfig, before: Record, after: Record) -> Record:
    """The algorithm's new cloud state `after` with the roster of `before` (an algorithm that writes its state
    afresh does not carry it)."""
    if config.selection is None or ROSTER not in before:
        return after
    return {**after, ROSTER: before[ROSTER]}


def selected_count(config: RunConfig, contributions: Sequence[Contribution]) -> int:
    """m: how many clients the contributions' edges selected, Σ_l max(⌊λ·N_l⌋, 1) over their members N_l."""
    return sum(num_selected(config.fraction, len(members(config, c))) for c in contributions)


def labels(contributions: Sequence[Contribution]) -> dict[int, dict[str, str]]:
    """The labels each declared member registered with."""
    return {m.client_id: dict(m.labels) for c in contributions for m in c.members or ()}
