"""An edge's DVFS pacing: the budget, in modelled seconds, that each task of a round gives its client (RunConfig.dvfs
.policy), written once for the edge service (edge/pacing.py, from its clients' device reports) and the reference
runner's virtual time (from the devices' modelled times).

- deadline: the round cannot end before its slowest selected client finishes at full speed, so that
  is the deadline (W, from each client's last full-speed time; `dvfs.deadline_s` fixes it instead).
  Faster clients slow down to meet it; a round with a client not heard from yet runs at full speed.
- slack (the asynchronous policy): W plus the time this edge's contribution will probably wait in the
  cloud's buffer. The cloud says how long the last one waited for the others (negative for the last to arrive,
  by how far it lagged); the clients had already absorbed part of that slack by running longer than W, so the
  prediction is that wait plus what the last round took beyond its W, never below 0: an edge on the critical path
  (wait ≤ 0, round ≈ W) keeps full speed, one that slowed down too far and came last gives back what it lagged by,
  and the others settle on the critical path's pace instead of racing to wait.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from fl_services.shared.core.config import RunConfig


@dataclass
class Pacing:
    full_speed: dict[int, float] = field(default_factory=dict)  # each client's last full-speed time, modelled s
    slack_s: float = 0.0
    last: tuple[float, float] | None = None  # the last round's (deadline W, slowest answer's time)

    def waited(self, wait_s: float) -> None:
        """The cloud's update consumed this edge's last contribution after it waited `wait_s` modelled seconds."""
        if self.last is not None:
            deadline, taken = self.last
            self.slack_s = max(0.0, wait_s + taken - deadline)

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

    def observed(self, config: RunConfig, clients: list[int], times: dict[int, tuple[float, float]]) -> None:
        """A round's answers, per client (its full-speed time, the time it took): how long the round's clients took."""
        for k, (full_speed, _) in times.items():
            self.full_speed[k] = full_speed
        deadline = self.deadline(config, clients)
        if times and deadline is not None:
            self.last = (deadline, max(taken for _, taken in times.values()))
