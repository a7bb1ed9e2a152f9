"""The edge's side of DVFS: the budget, in modelled seconds, that each task gives its client, by the rule of
shared/core/pacing.py, from its clients' device reports and the cloud's buffer waits."""
from __future__ import annotations

from fl_services.shared.core.algorithms.base import ClientResult
from fl_services.shared.core.config import RunConfig
from fl_services.shared.core.pacing import Pacing
from fl_services.shared.wire.edge_cloud import GlobalStateHeader


class EdgePacing(Pacing):
    def __init__(self, edge_id: int, run_id: str | None = None):
        super().__init__()
        self.edge_id = edge_id
        self.run_id = run_id

    def heard(self, header: GlobalStateHeader) -> None:
        """A new global state: a new run starts afresh; the buffer wait of this edge's last contribution
        (if this update consumed it) updates the predicted slack."""
        if header.run_id != self.run_id:
            vars(self).update(vars(EdgePacing(self.edge_id, header.run_id)))
        wait = header.buffer_waits.get(self.edge_id)
        if wait is not None:
            scale = header.config.dvfs.time_scale
            self.waited(wait / scale if scale > 0 else wait)

    def observe(self, config: RunConfig, clients: list[int], results: list[ClientResult]) -> None:
        """A round's results: each client's full-speed time, and how long the round's clients took."""
        self.observed(config, clients, {r.client_id: (r.device.full_speed_s, r.device.compute_s + r.device.comm_s)
                                          for r in results if r.device is not None})
