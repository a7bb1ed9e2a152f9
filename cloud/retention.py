"""Retention of ended runs: a background task of the cloud deletes the stopped and finished runs that the
settings no longer keep (retain_days, retain_runs), and says so in the audit log."""
from __future__ import annotations

import asyncio
import logging
from datetime import datetime, timedelta

from fl_services.cloud.audit import Auditor
from fl_services.cloud.storage import Conflict, NotFound, Store, now

log = logging.getLogger(__name__)


def expired(ended: list[tuple[str, datetime]], at: datetime, retain_days: float | None,
            retain_runs: int | None) -> list[str]:
    """The ended runs (id, when it ended) that retention drops: those ended more than `retain_days` before
    `at`, and all but the `retain_runs` that ended last. Oldest first."""
    by_end = sorted(ended, key=lambda run: run[1])
    drop: set[str] = set()
    if retain_days is not None:
        drop |= {run_id for run_id, ended_at in by_end if ended_at < at - timedelta(days=retain_days)}
    if retain_runs is not None:
        drop |= {run_id for run_id, _ in by_end[:max(len(by_end) - retain_runs, 0)]}
    return [run_id for run_id, _ in by_end if run_id in drop]


async def prune(store: Store, retain_days: float | None, retain_runs: int | None, audit: Auditor) -> list[str]:
    """Deletes the runs retention drops; returns their ids."""
    deleted = []
    for run_id in expired(await store.ended_runs(), now(), retain_days, retain_runs):
        try:
            await store.delete_run(run_id)
        except (NotFound, Conflict):  # deleted meanwhile, or (never for an ended run) active
            continue
        await audit("delete", run_id, f"retention (retain_days={retain_days}, retain_runs={retain_runs})")
        deleted.append(run_id)
    return deleted


async def run_forever(store: Store, retain_days: float | None, retain_runs: int | None, interval_s: float,
                      audit: Auditor) -> None:
    while True:
        try:
            deleted = await prune(store, retain_days, retain_runs, audit)
            if deleted:
                log.info("retention deleted %d ended runs: %s", len(deleted), ", ".join(deleted))
        except asyncio.CancelledError:
            raise
        except Exception:  # Redis away for a while: try again at the next turn
            log.exception("retention failed; trying again in %g s", interval_s)
        await asyncio.sleep(interval_s)
