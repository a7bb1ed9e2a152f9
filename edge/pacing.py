"""The edge's side of DVFS: the budget, in modelled seconds, that each task gives its client.

- deadline: the round cannot end before its slowest selected client finishes at full speed, so that
  is the deadline (W, from each client's last `full_speed_s` report; `dvfs.deadline_s` fixes it instead).
  Faster clients slow down to meet it; a round with a client not heard from yet runs at full speed.
- slack (the asynchronous policy): W plus the time this edge's contribution will probably wait in the
  cloud's buffer. The cloud says how long the last one waited for the others (GlobalStateHeader.
  buffer_waits; negative for the last to arrive, by how far it lagged); the clients had already absorbed
  part of that slack by running longer than W, so the prediction is that wait plus what the last round
  took beyond its W, never below 0: an edge on the critical path (wait ≤ 0, round ≈ W) keeps full speed,
  one that slowed down too far and came last gives back what it lagged by, and the others settle on the
  critical path's pace instead of racing to wait.
"""
from __future__ import annotations

from fl_services.shared.core.algorithms.base import ClientResult
from fl_services.shared.core.config import RunConfig
from fl_services.shared.wire.edge_cloud import GlobalStateHeader


class EdgePacing:
    def __init__(self, edge_id: int, run_id: str | None = None):
        self.edge_id = edge_id
        self.run_id = run_id
        self.full_speed: dict[int, float] = {}  # each client's last report: modelled seconds at the top frequency
        self.slack_s = 0.0
        self._last: tuple[float, float] | None = None  # the last round's (deadline W, slowest client's time)

    def heard(self, header: GlobalStateHeader) -> None:
        """A new global state: a new run starts afresh; the buffer wait of this edge's last contribution
        (if this update consumed it) updates the predicted slack."""
        if header.run_id != self.run_id:
            vars(self).update(vars(EdgePacing(self.edge_id, header.run_id)))
        wait = header.buffer_waits.get(self.edge_id)
        if wait is None or self._last is None:
            return
        scale = header.config.dvfs.time_scale
        deadline, taken = self._last
        self.slack_s = max(0.0, (wait / scale if scale > 0 else wait) + taken - deadline)

    def budget(self, config: RunConfig, clients: list[int]) -> float | None:
        """The modelled seconds this round's tasks may take; None: full speed."""
        if config.dvfs.policy == "max":
            return None
        deadline = self.deadline(config, clients)
        if deadline is None:
            return None
        return deadline + (self.slack_s if config.dvfs.policy == "slack" else 0.0)

    def deadline(self, config: RunConfig, clients: list[int]) -> float | None:
        if config.dvfs.deadline_s is not None:
            return config.dvfs.deadline_s
        if not clients or any(k not in self.full_speed for k in clients):
            return None
        return max(self.full_speed[k] for k in clients)

    def observe(self, config: RunConfig, clients: list[int], results: list[ClientResult]) -> None:
        """A round's results: each client's full-speed time, and how long the round's clients took."""
        reports = [r.device for r in results if r.device is not None]
        for r in results:
            if r.device is not None:
                self.full_speed[r.client_id] = r.device.full_speed_s
        deadline = self.deadline(config, clients)
        if reports and deadline is not None:
            self._last = (deadline, max(d.compute_s + d.comm_s for d in reports))
