"""The edge's device registry as an operator sees it: every device registered here, with its state, and the
bounded view of it the site report carries to the cloud."""
from __future__ import annotations

import heapq
import time
from collections import Counter
from datetime import datetime, timezone

from fl_services.edge.config import EdgeSettings
from fl_services.edge.membership import Membership
from fl_services.edge.tasks import TaskBoard
from fl_services.shared.core.data.summary import DataFit
from fl_services.shared.core.reports import FailureKind
from fl_services.shared.wire.admin import DeviceInfo
from fl_services.shared.wire.client_edge import ClientRegistration
from fl_services.shared.wire.edge_cloud import (
    DEVICE_STATES,
    FAILURE_SHOWN,
    MAX_DEVICE_RUNS,
    MAX_ID_RANGES,
    MAX_LABEL_SETS,
    MAX_REFUSALS_SHOWN,
    MAX_REPORTED_DEVICES,
    MAX_SITE_RUNS,
    DeviceBrief,
    DeviceState,
    LabelSetCount,
    SiteRefusal,
    SiteRun,
)


def offline_after_s(settings: EdgeSettings) -> float:
    """Two long-polls without a word: a polling device asks again at the latest when one ends."""
    return 2 * settings.long_poll_max_s + 5


class _States:
    """Each device's state, from one read of the board."""

    def __init__(self, board: TaskBoard):
        self.board, self.now = board, time.time()
        self.open_runs, self.failures = board.activity()

    def of(self, client_id: int) -> tuple[DeviceState, list[str], tuple[str, str, FailureKind] | None]:
        """The device's state, the runs whose task for it is open, and its last failure (run, reason, kind)."""
        runs, failure = self.open_runs.get(client_id, []), self.failures.get(client_id)
        state: DeviceState = ("offline" if self.board.offline(client_id, self.now)
                              else "uploading" if self.board.uploading(client_id) else "training" if runs
                              else "failed" if failure is not None else "idle")
        return state, runs, failure


def connected_devices(*, board: TaskBoard) -> int:
    """The registered devices not offline: heard from (registration, task poll, result) within the board's
    offline_after_s."""
    read = _States(board)
    return sum(1 for k in board.clients if read.of(k)[0] != "offline")


def list_devices(*, board: TaskBoard) -> list[DeviceInfo]:
    """Every registered device, by id; one not heard from (registration, task poll, result) for the board's
    offline_after_s is offline."""
    states = _States(board)
    now = states.now
    devices = []
    for client_id in sorted(board.clients):
        reg = board.clients[client_id]
        state, runs, failure = states.of(client_id)
        devices.append(DeviceInfo(client_id=client_id, state=state, labels=reg.labels, summary=reg.summary,
                                  registered_at=_utc(board.registered_at.get(client_id, now)),
                                  last_seen=_utc(board.last_seen.get(client_id, now)), runs=runs,
                                  failure=failure[1] if failure else None,
                                  failure_kind=failure[2] if failure else None))
    return devices


def family(reg: ClientRegistration) -> str | None:
    """The model family a device declares: its label "family", else its capability "family"."""
    declared = reg.labels.get("family", reg.capabilities.get("family"))
    return str(declared)[:64] if declared is not None else None


def site_devices(*, board: TaskBoard, memberships: dict[str, Membership] | None = None
                 ) -> tuple[dict[DeviceState, int], list[DeviceBrief], list[SiteRun], list[LabelSetCount]]:
    """What a site report says of the devices: every one counted per state, the first MAX_REPORTED_DEVICES of them
    by state (failed, uploading, training, idle, offline) then id, and each run's current round here, with its
    members and refusals (`memberships`, by run) for a run over registered devices, even before it has a task
    here, and the connected devices per label set and data fit (the MAX_LABEL_SETS most common). The report stays
    the same size whatever the number of devices."""
    read = _States(board)
    now = read.now
    states = {k: read.of(k) for k in board.clients}
    order = {state: i for i, state in enumerate(DEVICE_STATES)}
    listed = heapq.nsmallest(MAX_REPORTED_DEVICES, states, key=lambda k: (order[states[k][0]], k))
    page = []
    for client_id in listed:
        state, runs, failure = states[client_id]
        reg = board.clients[client_id]
        page.append(DeviceBrief(
            client_id=client_id, state=state, last_seen=_utc(board.last_seen.get(client_id, now)),
            samples=reg.summary.samples if reg.summary is not None else None, family=family(reg),
            runs=runs[:MAX_DEVICE_RUNS],
            failure=_shortened(failure[1]) if failure else None, failure_kind=failure[2] if failure else None,
            failed_run=failure[0] if failure else None))
    counts = Counter(state for state, _, _ in states.values())
    groups: dict[tuple[tuple[tuple[str, str], ...], DataFit | None], list[int]] = {}
    for k, (state, _, _) in states.items():
        if state != "offline":
            groups.setdefault(_label_set(board.clients[k]), []).append(k)
    memberships = memberships or {}
    counted = {run_id: (version, tasks, answered, failed)
               for run_id, version, tasks, answered, failed in board.tallies()}
    tallies = [SiteRun(run_id=run_id, version=version, tasks=tasks, answered=answered, failed=failed,
                       members=len(memberships[run_id].ids) if run_id in memberships else None,
                       refused=[SiteRefusal(client_id=f.client_id, error=_shortened(f.error))
                                for f in memberships[run_id].refused[:MAX_REFUSALS_SHOWN]]
                       if run_id in memberships else [])
               for run_id, (version, tasks, answered, failed) in sorted({**dict.fromkeys(memberships, (0, 0, 0, 0)),
                                                                **counted}.items())[:MAX_SITE_RUNS]]
    return ({s: counts[s] for s in DEVICE_STATES if counts[s]}, page, tallies,
            [LabelSetCount(labels=dict(labels), fit=fit, devices=len(ids),
                           ids=None if fit is not None else _ranges(ids))
             for (labels, fit), ids in heapq.nlargest(MAX_LABEL_SETS, groups.items(), key=lambda g: len(g[1]))])


def _label_set(reg: ClientRegistration) -> tuple[tuple[tuple[str, str], ...], DataFit | None]:
    """A connected device's group in a site report: its labels and what its data can train."""
    return tuple(sorted(reg.labels.items())), DataFit.of(reg.summary) if reg.summary is not None else None


def _ranges(ids: list[int]) -> list[tuple[int, int]] | None:
    """The ids as inclusive ranges, None where they take more than MAX_ID_RANGES."""
    ranges: list[tuple[int, int]] = []
    for k in sorted(ids):
        if ranges and ranges[-1][1] == k - 1:
            ranges[-1] = (ranges[-1][0], k)
        else:
            ranges.append((k, k))
    return ranges if len(ranges) <= MAX_ID_RANGES else None


def _shortened(text: str) -> str:
    return text if len(text) <= FAILURE_SHOWN else text[:FAILURE_SHOWN - 1] + "…"


def _utc(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, timezone.utc)
