"""Each client's latest report and their mean ± spread per client group (model family for prototype
learning), from a run's history: what `fedctl` prints at the end and the cloud's dashboard shows live."""
from __future__ import annotations

import statistics

from fl_services.shared.core.config import RunConfig
from fl_services.shared.core.reports import RoundRecord


def client_reports(history: list[RoundRecord]) -> dict[int, dict[str, float]]:
    """Each client's last report (the metrics it sent with its latest consumed result), its edge and
    how many of its results the run consumed."""
    latest: dict[int, dict[str, float]] = {}
    for h in history:
        for c in h.clients:
            rounds = latest.get(c.client_id, {}).get("rounds", 0) + 1
            latest[c.client_id] = {**c.metrics, "edge": c.edge_id, "rounds": rounds}
    return latest


def group_summary(config: RunConfig, reports: dict[int, dict[str, float]]) -> dict[str, dict[str, tuple[float, float]]]:
    """Mean and spread (population std) over clients of every reported metric, per client group
    (model family for prototype learning) and for "all"."""
    # The algorithms (torch) load here, not with the module: `fedctl results` prints the reports without them.
    from fl_services.shared.core.algorithms import registry

    algorithm = registry.create(config)
    groups: dict[str, list[dict[str, float]]] = {}
    for k, report in sorted(reports.items()):
        groups.setdefault(algorithm.client_group(k), []).append(report)
    if len(groups) > 1:
        groups["all"] = [r for k, r in sorted(reports.items())]
    names = sorted({n for r in reports.values() for n in r} - {"edge", "rounds"})
    return {
        group: {n: (statistics.mean(v), statistics.pstdev(v))
                for n in names if (v := [r[n] for r in members if n in r])}
        for group, members in groups.items()
    }
