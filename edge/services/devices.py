"""The edge's device registry as an operator sees it: every device registered here, with its state."""
from __future__ import annotations

import time
from datetime import datetime, timezone

from fl_services.edge.config import EdgeSettings
from fl_services.edge.tasks import TaskBoard
from fl_services.shared.wire.admin import DeviceInfo, DeviceState


def offline_after_s(settings: EdgeSettings) -> float:
    """How long a device goes unheard before it is offline: two long-polls without a word (a polling device asks
    again at the latest when one ends)."""
    return 2 * settings.long_poll_max_s + 5


def connected_devices(*, board: TaskBoard, offline_after_s: float) -> int:
    """The registered devices heard from (registration, task poll, result) within `offline_after_s`."""
    now = time.time()
    return sum(1 for k in board.clients if now - board.last_seen.get(k, now) <= offline_after_s)


def list_devices(*, board: TaskBoard, offline_after_s: float) -> list[DeviceInfo]:
    """Every registered device, by id; one not heard from (registration, task poll, result) for `offline_after_s`
    is offline: a polling device is heard from at least once per long-poll."""
    now = time.time()
    devices = []
    for client_id in sorted(board.clients):
        reg = board.clients[client_id]
        runs, failure = board.open_runs(client_id), board.last_failure(client_id)
        last_seen = board.last_seen.get(client_id, now)
        state: DeviceState = ("offline" if now - last_seen > offline_after_s else "training" if runs
                              else "failed" if failure is not None else "idle")
        devices.append(DeviceInfo(client_id=client_id, state=state, labels=reg.labels, summary=reg.summary,
                                  registered_at=_utc(board.registered_at.get(client_id, now)),
                                  last_seen=_utc(last_seen), runs=runs, failure=failure))
    return devices


def _utc(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, timezone.utc)
