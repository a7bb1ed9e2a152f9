"""The edge's Prometheus metrics (`GET /metrics`), besides the request histogram every service has.

Gauges are read from the task board and the round loop at scrape time (callbacks), so they cost
nothing between scrapes. Clients report their training time and samples with each result
(`ClientResultHeader.train_seconds`, `num_samples`); the edge exports them here.
"""
from __future__ import annotations

from collections.abc import Callable

from prometheus_client import Counter, Gauge, Histogram

from fl_services.shared.core.reports import REPORTED_FAILURES
from fl_services.shared.server.metrics import ServiceMetrics, refusal_reason
from fl_services.shared.wire.client_edge import ClientResultHeader

RESULTS_ROUTE = "/api/v1/clients/{client_id}/results"
# A result bundle's results are counted one by one where they are taken (edge/services/clients.py); a bundle
# refused whole (unreadable, too large, over the open uploads) counts as one refusal here.
RESULT_BUNDLE_ROUTE = "/api/v1/clients/results"
# Refusals of a result: the task board's (edge/tasks.py TaskConflict reasons) and those of the request.
REFUSALS = ("stale", "duplicate", "unreadable", "unauthorized", "not_found", "too_large", "invalid")
_TRAIN_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 900)


class EdgeMetrics(ServiceMetrics):
    def __init__(self, long_poll_max_s: float = 25.0):
        super().__init__(long_poll_max_s)
        r = self.registry
        self.results = Counter("fl_edge_results_received", "Client results accepted", registry=r)
        self.refused = self.refusals("fl_edge_results_refused", "Client results refused, by reason", REFUSALS)
        self.round_seconds = Histogram("fl_edge_round_duration_seconds",
                                       "Edge rounds, from the global state's arrival to the contribution's submission",
                                       buckets=_TRAIN_BUCKETS, registry=r)
        self.submissions = Counter("fl_edge_submissions", "Contributions sent to the cloud, by its answer's status",
                                   ["status"], registry=r)
        self.train_seconds = Histogram("fl_client_train_seconds", "Local training time clients report "
                                       "with their results (wall time of local_update)", buckets=_TRAIN_BUCKETS,
                                       registry=r)
        self.samples = Counter("fl_client_samples", "Training samples clients report with their accepted results",
                               registry=r)
        self.device_tokens_refused = self.refusals(
            "fl_edge_device_tokens_refused", "Requests refused for their device token, by reason: invalid, revoked, "
            "other_site (a token bound to another site)", ("invalid", "revoked", "other_site"))
        self.clients = Gauge("fl_edge_clients_connected", "Logical clients registered with this edge", registry=r)
        self.devices_registered = Gauge("fl_edge_devices_registered", "Devices registered at this edge, by its site",
                                        ["site"], registry=r)
        self.devices_connected = Gauge("fl_edge_devices_connected", "Devices registered at this edge and heard from "
                                       "lately (not offline), by its site", ["site"], registry=r)
        self.outstanding = Gauge("fl_edge_tasks_outstanding", "Tasks of the current round not answered yet",
                                 registry=r)
        self.version = Gauge("fl_edge_global_version", "Version of the last global state received (-1: none)",
                             registry=r)
        self.client_failures = self.refusals(
            "fl_edge_client_failures", "Tasks clients reported they could not train, by kind (shared/core/reports.py, "
            "ReportedFailure)", REPORTED_FAILURES)
        self.observe_route("POST", RESULTS_ROUTE, self._result)
        self.observe_route("POST", RESULT_BUNDLE_ROUTE, self._bundle)

    def _result(self, status: int, outcome: str | None, _: dict[str, str]) -> None:
        if status == 202:
            self.results.inc()
        else:
            self.refused.labels(refusal_reason(status, outcome)).inc()

    def _bundle(self, status: int, outcome: str | None, _: dict[str, str]) -> None:
        if status >= 400:
            self.refused.labels(refusal_reason(status, outcome)).inc()

    def trained(self, header: ClientResultHeader) -> None:
        """An accepted result's report (old clients send no train time: only their samples count)."""
        self.samples.inc(header.num_samples)
        if header.train_seconds is not None:
            self.train_seconds.observe(header.train_seconds)

    def watch(self, clients: Callable[[], float], outstanding: Callable[[], float],
              version: Callable[[], float], site: str, connected: Callable[[], float]) -> None:
        """The gauges' sources, read at scrape time: the registered clients (the site's devices), those connected,
        the tasks not answered yet, and the version of the last global state received (-1: none)."""
        self.clients.set_function(clients)
        self.devices_registered.labels(site).set_function(clients)
        self.devices_connected.labels(site).set_function(connected)
        self.outstanding.set_function(outstanding)
        self.version.set_function(version)
