"""The cyclic garbage collector as a long-running service sets it (docs/decisions/collector-thresholds.md)."""
from __future__ import annotations

import gc

# Net allocations of container objects between two collections of the youngest generation (Python's default:
# 700), and how many of those between collections of the next ones (default: 10, 10).
THRESHOLDS = (10_000, 10, 10)


def tune_collector() -> None:
    """A service allocates and drops many short-lived containers per request, per task and per round (parsed
    bodies, pydantic models, records), nearly all freed by their reference counts: at the default threshold the
    collector runs hundreds of times a second under load, tracing the same survivors each time."""
    gc.set_threshold(*THRESHOLDS)
