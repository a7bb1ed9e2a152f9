"""What the dashboard shows of a run beyond its info and history: each edge against the buffer, and the
clients' latest reports per group, built from the store's reads so that the routes stay thin."""
from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import AsyncIterator
from datetime import datetime

from fl_services.cloud.orchestrator import Orchestrator
from fl_services.cloud.storage import NotFound, Store
from fl_services.shared.core.client_reports import client_reports, group_summary
from fl_services.shared.core.reports import ContributionRecord, EdgeContributionHeader, RoundRecord, RunStatus
from fl_services.shared.server.app import Stopping
from fl_services.shared.wire.admin import EdgeStatus, RunEdges, RunInfo, RunUpdate

# A stream says something at least this often, so proxies and browsers keep an idle connection open.
KEEPALIVE_S = 15.0
# How often a stream looks for contributions entering the buffer: those wake no one (only new versions
# and state changes are announced), and another cloud process sharing the Redis announces nothing here.
LOOK_S = 0.5
_ENDED = {RunStatus.finished, RunStatus.stopped}


def run_edges(info: RunInfo, registered: set[int], buffered: list[tuple[datetime, EdgeContributionHeader]],
              history: list[RoundRecord]) -> RunEdges:
    """Each of the run's edges: its waiting contribution if there is one, else the last one consumed."""
    last: dict[int, tuple[ContributionRecord, int]] = {}
    consumed: Counter[int] = Counter()
    for record in history:
        for c in record.contributions:
            last[c.edge_id] = (c, record.version)
            consumed[c.edge_id] += 1
    waiting = {header.edge_id: (at, header) for at, header in buffered}
    edges = []
    for edge_id in info.config.edge_ids():
        common = dict(edge_id=edge_id, registered=edge_id in registered, consumed=consumed[edge_id])
        if edge_id in waiting:
            at, header = waiting[edge_id]
            edges.append(EdgeStatus(**common, waiting=True, base_version=header.base_version,
                                    staleness=info.version - header.base_version, received_at=at))
        elif edge_id in last:
            consumed_record, version = last[edge_id]
            edges.append(EdgeStatus(**common, waiting=False, base_version=consumed_record.base_version,
                                    staleness=consumed_record.staleness, consumed_in=version))
        else:
            edges.append(EdgeStatus(**common, waiting=False))
    return RunEdges(run_id=info.run_id, version=info.version, buffer_size=info.config.topology.buffer_size,
                    buffered=len(buffered), edges=edges)


async def read_edges(store: Store, info: RunInfo, history: list[RoundRecord]) -> RunEdges:
    return run_edges(info, await store.registered_edges(), await store.buffered_headers(info.run_id), history)


class LiveRun:
    """One dashboard's live stream of a run. It keeps the history it has sent, so each turn reads only
    the new records, and it sends an update only when something changed."""

    def __init__(self, store: Store, run_id: str):
        self.store, self.run_id = store, run_id
        self.history: list[RoundRecord] = []
        self._shown: tuple[str, RunEdges] | None = None  # the info as JSON: null == null
        self._groups: dict[str, dict[str, tuple[float, float]]] = {}

    async def update(self) -> RunUpdate | None:
        """What changed since the last update (the first carries everything); None if nothing did.
        Raises NotFound for an unknown run."""
        info = await self.store.info(self.run_id)
        # The last record may be published before its evaluation (NaN until the cloud fills it in): read again
        # from there, and send it again once it changed.
        pending = bool(self.history) and math.isnan(self.history[-1].test_accuracy)
        start = len(self.history) - pending
        read = await self.store.history_since(self.run_id, start)
        new = [r for i, r in enumerate(read)  # compared as JSON, where null equals null (NaN != NaN)
               if start + i >= len(self.history) or self.history[start + i].model_dump_json() != r.model_dump_json()]
        self.history[start:] = read
        edges = await read_edges(self.store, info, self.history)
        if self._shown == (info.model_dump_json(), edges) and not new:
            return None
        if new or self._shown is None:
            self._groups = group_summary(info.config, client_reports(self.history))
        self._shown = (info.model_dump_json(), edges)
        return RunUpdate(info=info, edges=edges, groups=self._groups, rounds=new)

    async def stream(self, first: RunUpdate | None, orchestrator: Orchestrator,
                     stopping: Stopping) -> AsyncIterator[str]:
        """Server-sent events until the run has ended (after its final state) or the cloud stops."""
        update: RunUpdate | None = first
        said = time.monotonic()
        while True:
            if update is not None:
                yield f"event: update\ndata: {update.model_dump_json()}\n\n"
                said = time.monotonic()
                if update.info.status in _ENDED:
                    return
            elif time.monotonic() - said >= KEEPALIVE_S:
                yield ": keepalive\n\n"
                said = time.monotonic()
            if stopping.is_set():
                return

            async def changed() -> RunUpdate | bool | None:
                # True once the cloud is stopping, or the run is gone (stopped and deleted between two looks):
                # the stream ends at once.
                try:
                    return stopping.is_set() or await self.update()
                except NotFound:
                    return True

            # Wakes on a new version or status change and looks again every LOOK_S for buffer changes (one
            # look each, not two), until the keepalive is due.
            found = await orchestrator.wait_until(changed, max(KEEPALIVE_S - (time.monotonic() - said), 0.0),
                                                  recheck_s=LOOK_S)
            if found is True:
                return
            update = found if isinstance(found, RunUpdate) else None
