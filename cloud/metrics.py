"""The cloud's Prometheus metrics (`GET /metrics`), besides the request histogram every service has.

The global version and the buffer depth are read from the store at each scrape, so a restarted cloud
reports what Redis holds, not what this process happened to see.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client import Counter, Gauge, Histogram

from fl_services.shared.core.reports import FAILURE_KINDS
from fl_services.shared.server.metrics import ServiceMetrics, refusal_reason
from fl_services.shared.wire.admin import SiteInfo

if TYPE_CHECKING:
    from fl_services.cloud.storage import Store

CONTRIBUTIONS_ROUTE = "/api/v1/edges/{edge_id}/contributions"
# Refusals of a contribution: the buffer's own (the storage's Conflict reasons) and those of the request.
REFUSALS = ("not_running", "future", "stale", "conflict", "key_reused", "pending", "member_elsewhere",
            "unreadable", "unauthorized", "not_found", "too_large", "invalid")
# Gauges per run: the active runs and the newest runs (a finished run's last values stay visible).
RUNS_SHOWN = 10


def connected(site: SiteInfo) -> int:
    """The site's devices not offline, from its report's count per state."""
    return sum(n for state, n in site.states.items() if state != "offline")


class CloudMetrics(ServiceMetrics):
    def __init__(self, long_poll_max_s: float = 25.0):
        super().__init__(long_poll_max_s)
        r = self.registry
        self.contributions = Counter("fl_cloud_contributions", "Contributions accepted into the buffer, per edge "
                                     "(outcome: accepted, or duplicate for a retry answered again)",
                                     ["edge_id", "outcome"], registry=r)
        self.refused = self.refusals("fl_cloud_contributions_refused", "Contributions refused, by reason", REFUSALS)
        self.update_seconds = Histogram("fl_cloud_update_duration_seconds",
                                        "cloud_update with its evaluation, per computed update",
                                        buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300), registry=r)
        self.stale_dropped = Counter("fl_cloud_stale_dropped", "Contributions consumed but dropped as staler than "
                                     "their run's topology.staleness.max (every run's; each update's record lists "
                                     "its own)", registry=r)
        self.version = Gauge("fl_cloud_global_version", "Version of the run's global state", ["run_id"], registry=r)
        self.buffered = Gauge("fl_cloud_buffer_depth", "Contributions waiting in the run's buffer", ["run_id"],
                              registry=r)
        self.client_failures = self.refusals(
            "fl_cloud_client_failures", "Devices that failed a round, as the published rounds record them, by kind "
            "(shared/core/reports.py, FailureKind)", FAILURE_KINDS)
        self.site_devices = Gauge("fl_cloud_site_devices_registered", "Devices registered at each site, as its last "
                                  "site report said", ["site"], registry=r)
        self.site_connected = Gauge("fl_cloud_site_devices_connected", "Devices connected (not offline) at each "
                                    "site, as its last site report said", ["site"], registry=r)
        self.observe_route("POST", CONTRIBUTIONS_ROUTE, self._contribution)

    def _contribution(self, status: int, outcome: str | None, path_params: dict[str, str]) -> None:
        if status == 202:
            # The id as the route read it (a 202 means it parsed), not as spelled: "007" is edge 7's series.
            self.contributions.labels(str(int(path_params["edge_id"])), outcome or "accepted").inc()
        else:
            self.refused.labels(refusal_reason(status, outcome)).inc()

    def watch_store(self, store: Store) -> None:
        async def refresh() -> None:
            runs = (await store.run_ids())[-RUNS_SHOWN:]
            runs += [run_id for run_id in await store.active_runs() if run_id not in runs]
            infos = await store.infos(runs)  # all read before any gauge changes
            sites = await store.sites()
            self.version.clear()
            self.buffered.clear()
            for info in infos:
                self.version.labels(info.run_id).set(info.version)
                self.buffered.labels(info.run_id).set(info.buffered)
            self.site_devices.clear()
            self.site_connected.clear()
            for site in sites:  # an edge that reports no count has no series
                if site.devices is not None:
                    self.site_devices.labels(site.name).set(site.devices)
                    self.site_connected.labels(site.name).set(connected(site))

        self.before_scrape(refresh)
