"""An edge round's traffic: its tasks posted on the task board, their answers collected (quorum, retries), and
its contribution submitted to the cloud."""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from functools import partial

import httpx
from prometheus_client import Counter

from fl_services.edge.tasks import Task, TaskBoard
from fl_services.shared.core import late
from fl_services.shared.core.algorithms.base import Algorithm, ClientResult
from fl_services.shared.core.config import RoundPolicy
from fl_services.shared.core.edge_round import ClientTask, first_answers
from fl_services.shared.core.federation import participation, site_evaluation
from fl_services.shared.core.late import LateAggregate
from fl_services.shared.core.records import Record, encode
from fl_services.shared.core.reports import ClientFailure, EdgeContributionHeader, Member
from fl_services.shared.wire.client_edge import ClientTaskHeader
from fl_services.shared.wire.edge_cloud import GlobalStateHeader
from fl_services.shared.wire.http import binary_body
from fl_services.shared.wire.protocol import MEMBERS_ELSEWHERE, members_elsewhere
from fl_services.shared.wire.retry import DEDUPLICATED

log = logging.getLogger(__name__)


class MembersElsewhere(Exception):
    """The cloud refused the contribution: it declares devices another site holds in the run (device -> edge)."""

    def __init__(self, holders: dict[int, int], message: str):
        super().__init__(message)
        self.holders = holders


class RoundAbandoned(Exception):
    """The cloud moved on while the round waited for clients that cannot answer."""


class Dispatch:
    """Posts an edge round's tasks, collects their answers and submits the round's contribution."""

    def __init__(self, edge_id: int, board: TaskBoard, cloud: httpx.AsyncClient, max_client_samples: int | None,
                 submissions: Counter):
        self.edge_id = edge_id
        self.board = board
        self.cloud = cloud
        self.max_client_samples = max_client_samples
        self.submissions = submissions  # by the cloud's answer's status

    def task(self, header: GlobalStateHeader, task: ClientTask, algorithm: Algorithm, budget_s: float | None,
             num_samples: int | None, secure_round: str | None = None) -> Task:
        """Client k's task of this round; with its sample count known (`num_samples`), a result must claim it.
        Claims weigh at most the run's max_samples_per_device, else the edge's max_client_samples."""
        message = ClientTaskHeader(
            task_id=f"{header.run_id}-r{task.round}-e{self.edge_id}-c{task.client_id}", run_id=header.run_id,
            client_id=task.client_id, round=task.round, version=header.version, config=header.config,
            budget_s=budget_s, secure_round=secure_round,
        )
        cap = header.config.max_samples_per_device or self.max_client_samples
        return Task(message, task.tensors, partial(algorithm.check_result, task.tensors), num_samples=num_samples,
                    max_samples=cap)

    async def collect(self, header: GlobalStateHeader, tasks: list[Task], policy: RoundPolicy,
                      failures: list[ClientFailure], moved_on: Callable[[], Awaitable[bool]],
                      all_failed: Callable[[list[ClientFailure]], Awaitable[None]] | None = None) -> list[ClientResult]:
        """Waits for answers; re-runs the round (same tasks) while fewer than the quorum answered; after
        max_retries, goes on with any answer, waiting for a first one only until the cloud `moved_on`.
        A client's reported failure ends the wait for it; the failures left unanswered join `failures`.
        (A run that ends meanwhile cancels the whole round: see EdgeRoundLoop._forget_ended.)"""
        run_id, version = header.run_id, header.version
        # With policy.answers = K, the round closes at the K-th answer. The tasks still open are withdrawn below, so
        # a later answer is refused (409) and dropped; or, with policy.late = 'join', they stay open, and an answer
        # that comes joins a later round (EdgeRoundLoop.run_round, shared/core/late.py).
        join = policy.late == "join"
        enough, quorum = policy.enough(len(tasks)), policy.quorum(len(tasks))
        await self.board.post(tasks, keep_late=join)
        log.info("edge %d: posted %d tasks of run %s, version %d", self.edge_id, len(tasks), run_id, version)
        closed: set[int] = set()  # the clients whose answers the round closes with
        try:
            for attempt in range(policy.max_retries + 1):
                results = await self.board.wait_results(run_id, policy.deadline_s, enough=enough, version=version)
                if len(results) >= quorum:
                    # More than K answers when the round closes (they came together): the K the reference runner
                    # takes, of least modelled time, ties to the lower id; the others are late (policy.late).
                    results = first_answers(header.config, results, tasks[0].header.budget_s)
                    closed = {r.client_id for r in results}
                    return results
                if attempt < policy.max_retries:
                    log.warning("edge %d: %d/%d answered (quorum %d); waiting again (retry %d of %d)",
                                self.edge_id, len(results), len(tasks), quorum, attempt + 1, policy.max_retries)
            while not results:
                # Every task failed (a failed task is not handed out again): said to the cloud (`all_failed`),
                # which stops a run whose every edge says so.
                failed = self.board.failures(run_id)
                if all_failed is not None and len(failed) == len(tasks):
                    await all_failed(failed)
                # No client can answer (e.g. every one fails on a diverged model): without this check the
                # edge would wait here for good, even after its run moved on to a newer version.
                if await moved_on():
                    raise RoundAbandoned(f"run {run_id} moved on from version {header.version}")
                # Every client may have reported failure: wait the deadline for a result all the same.
                results = await self.board.wait_results(run_id, policy.deadline_s, failures_settle=False,
                                                        version=version)
            log.warning("edge %d: proceeding below quorum with %d results", self.edge_id, len(results))
            closed = {r.client_id for r in results}
            return results
        finally:
            failures.extend(self.board.failures(run_id, version))
            if closed and not join and (enough is None or len(closed) < enough):
                # Closed at its deadline, not by `enough` answers (which withdraw the rest, unfailed): the devices
                # that did not answer are named, gone offline or timed out. Under 'join' they may still answer.
                failures.extend(self.board.unanswered(run_id, version, _deadline(policy)))
            # Kept with policy.late = 'join': older rounds' late tasks, and this round's open ones once it closed.
            await self.board.clear(run_id, (lambda t: t.header.version < version or bool(
                closed and t.failure is None and t.header.client_id not in closed)) if join else None)

    async def submit(self, header: GlobalStateHeader, tensors: Record, weight: float,
                     results: list[ClientResult], failures: list[ClientFailure], members: list[Member],
                     late_parts: Sequence[LateAggregate] = ()) -> None:
        clients = participation(results)
        message = EdgeContributionHeader(
            run_id=header.run_id,
            edge_id=self.edge_id,
            base_version=header.version,
            # Deterministic, so a retry after a lost answer (or an edge restart) is counted once.
            idempotency_key=f"{header.run_id}:{self.edge_id}:{header.version}",
            weight=weight,
            clients=clients,
            failures=failures,
            members=members,
            evaluation=site_evaluation(clients),
            late=[p.part() for p in late_parts],
        )
        blob = await asyncio.to_thread(encode, late.merged(tensors, list(late_parts)), message)
        # Re-sent through a passing fault: the cloud counts an idempotency key once.
        response = await self.cloud.post(f"/api/v1/edges/{self.edge_id}/contributions", **binary_body(blob),
                                         extensions=DEDUPLICATED)
        self.submissions.labels(str(response.status_code)).inc()
        if response.status_code == 409 and MEMBERS_ELSEWHERE in response.headers:
            raise MembersElsewhere(members_elsewhere(response.headers[MEMBERS_ELSEWHERE]), response.text[:300])
        if response.status_code == 409:  # counted already, or the run moved on: nothing to do
            log.info("edge %d: %s", self.edge_id, response.text[:300])
        elif response.status_code >= 400:
            # The same contribution would be refused again (too large, values beyond the bounds): the run
            # cannot use this round. Said loudly: a synchronous run waits for this edge.
            log.error("edge %d: cloud refused the contribution of version %d: %s %s", self.edge_id,
                      header.version, response.status_code, response.text[:300])


def _deadline(policy: RoundPolicy) -> str:
    retries = f", {policy.max_retries} {'retry' if policy.max_retries == 1 else 'retries'} while below quorum" \
        if policy.max_retries else ""
    return f"{policy.deadline_s:g} s{retries}"
