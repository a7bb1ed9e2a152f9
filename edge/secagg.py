"""An edge round under secure aggregation (RunConfig.secure_aggregation.edge): the edge drives the protocol's steps
(shared/core/secagg/protocol.py) over its clients' dial-out requests, relaying keys and encrypted shares it cannot
read, and unmasks only the sum of the remaining devices' updates.

A device that trained posts its public keys with its result's header: that answers its task on the board, so the
round's usual wait (policy.deadline_s, again while fewer than policy.min_fraction answered, up to
policy.max_retries times) is step 0. Each later step waits up to secure_aggregation.phase_timeout_s
for the devices still in; a step that ends with fewer than t of them fails the round (SecAggAbort), which the
round loop re-runs as any failed round."""
from __future__ import annotations

import asyncio
import base64
import logging
from pathlib import Path

import numpy as np

from fl_services.edge.tasks import Task, TaskBoard, TaskConflict
from fl_services.shared.core.algorithms.base import Algorithm
from fl_services.shared.core.config import RoundPolicy
from fl_services.shared.core.edge_round import SecureSum
from fl_services.shared.core.reports import ClientFailure
from fl_services.shared.core.secagg import fixedpoint, primitives
from fl_services.shared.core.secagg.protocol import AggregatorSession, ProtocolViolation, SecAggAbort
from fl_services.shared.core.tensors import InvalidContent
from fl_services.shared.runtime.files import atomic_write
from fl_services.shared.server.longpoll import wait_until
from fl_services.shared.wire.secagg import SecAggKeys, SecAggShares, SecAggStep, SecAggUnmask, Step

log = logging.getLogger(__name__)

STEPS: tuple[Step, ...] = ("roster", "inbox", "remaining")


def site_key(edge_id: int, directory: Path | None) -> bytes:
    """This edge's X25519 private key for secure aggregation between sites (shared/core/secagg/sites.py), kept in
    its state directory: a run takes its sites' public keys when it is created, so a restarted edge must keep its
    key to go on contributing to it. Without a directory, a new key each start (and a restart strands such runs)."""
    path = directory / f"edge{edge_id}.mask-key" if directory is not None else None
    if path is not None and path.exists():
        raw = path.read_bytes()
        if len(raw) == primitives.KEY_BYTES:
            return raw
        log.error("edge %d: key file %s is unreadable; making a new key", edge_id, path)
    raw = primitives.private_bytes(primitives.new_private_key())
    if path is not None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(path, raw)
        except OSError as exc:  # the edge serves all the same; only a restart would strand its runs
            log.error("edge %d: cannot keep its key for secure aggregation between sites in %s (%s): a restart will "
                      "make another, and the runs created with this one will not take its contributions",
                      edge_id, path, exc)
    return raw


def site_public_key(private: bytes) -> str:
    return base64.b64encode(primitives.public_bytes(primitives.private_key(private))).decode("ascii")


def round_name(run_id: str, version: int, round: int, edge_id: int) -> str:
    """The protocol's context: every key agreed and every share encrypted in it is bound to this round."""
    return f"{run_id}:v{version}:r{round}:e{edge_id}"


class SecureRound:
    """One edge round's protocol: its aggregator session, the step it has reached, and the devices' waits."""

    def __init__(self, name: str, tasks: list[Task], algorithm: Algorithm):
        self.name = name
        self.config = algorithm.config.secure_aggregation
        self.algorithm = algorithm
        self.tasks = {t.header.task_id: t for t in tasks}
        self.layout = fixedpoint.layout(algorithm.result_spec(tasks[0].tensors))
        self.session = AggregatorSession(sorted(t.header.client_id for t in tasks), self.config.threshold,
                                         fixedpoint.length(self.layout), name.encode(), self.config.bits)
        self.weights: dict[int, int] = {}
        self.step = 0  # steps closed: 1 roster published, 2 inbox, 3 remaining
        self.failed: str | None = None
        self.changed = asyncio.Condition()

    # ---- the devices' side (edge/services/secagg.py) -----------------------------------------------
    def _open(self, client_id: int, task_id: str, step: int) -> None:
        task = self.tasks.get(task_id)
        if task is None or task.header.client_id != client_id:
            raise TaskConflict(f"task {task_id!r} of client {client_id} is not in secure round {self.name}", "stale")
        if self.failed is not None:
            raise TaskConflict(f"secure round {self.name} failed: {self.failed}", "stale")
        if self.step != step:
            raise TaskConflict(f"step {step} of secure round {self.name} is closed (the round is at step "
                               f"{self.step})", "stale")

    async def changed_now(self) -> None:
        async with self.changed:
            self.changed.notify_all()

    async def add_keys(self, board: TaskBoard, client_id: int, task_id: str, keys: SecAggKeys) -> None:
        self._open(client_id, task_id, 0)
        if keys.result.client_id != client_id or keys.result.task_id != task_id:
            raise InvalidContent("the result header names another client or task")
        board.admissible(client_id, keys.result)  # its claims checked before its keys join the roster
        try:
            self.session.add_keys(client_id, keys.c_pk, keys.s_pk)
        except ProtocolViolation as exc:
            raise InvalidContent(str(exc)) from exc
        await board.accept_secure(client_id, keys.result)

    async def add_shares(self, client_id: int, task_id: str, shares: SecAggShares) -> None:
        self._open(client_id, task_id, 1)
        try:
            self.session.add_shares(client_id, shares.commitment, dict(shares.ciphertexts))
        except ProtocolViolation as exc:
            raise InvalidContent(str(exc)) from exc
        await self.changed_now()

    async def add_masked(self, client_id: int, task_id: str, words: np.ndarray) -> None:
        self._open(client_id, task_id, 2)
        try:
            self.session.add_masked(client_id, words)
        except ProtocolViolation as exc:
            raise InvalidContent(str(exc)) from exc
        await self.changed_now()

    async def add_unmask(self, client_id: int, task_id: str, unmask: SecAggUnmask) -> None:
        self._open(client_id, task_id, 3)
        try:
            self.session.add_unmask(client_id, dict(unmask.s_shares), dict(unmask.b_shares))
        except ProtocolViolation as exc:
            raise InvalidContent(str(exc)) from exc
        await self.changed_now()

    async def wait_step(self, client_id: int, task_id: str, step: Step, timeout: float) -> SecAggStep | None:
        """What the edge relays to this device once `step` closes (None: not before the timeout); 409 once the
        round failed, or for a device the step left out."""
        wanted = STEPS.index(step) + 1
        task = self.tasks.get(task_id)
        if task is None or task.header.client_id != client_id:
            raise TaskConflict(f"task {task_id!r} of client {client_id} is not in secure round {self.name}", "stale")
        await wait_until(self.changed, lambda: self.step >= wanted or self.failed is not None, timeout)
        if self.failed is not None:
            raise TaskConflict(f"secure round {self.name} failed: {self.failed}", "stale")
        if self.step < wanted:
            return None
        s = self.session
        assert s.roster is not None
        if client_id not in s.roster:
            raise TaskConflict(f"client {client_id} advertised no keys in time for secure round {self.name}", "stale")
        if wanted == 1:
            return SecAggStep(step=step, threshold=s.t, keys=s.roster, weights=self.weights)
        assert s.survivors is not None
        if client_id not in s.survivors:
            raise TaskConflict(f"client {client_id} shared no keys in time for secure round {self.name}", "stale")
        if wanted == 2:
            return SecAggStep(step=step, threshold=s.t, survivors=s.survivors, ciphertexts=s.inbox(client_id))
        assert s.remaining is not None
        if client_id not in s.remaining:
            raise TaskConflict(f"client {client_id} sent no masked input in time for secure round {self.name}",
                               "stale")
        return SecAggStep(step=step, threshold=s.t, remaining=s.remaining)

    # ---- the edge's side ---------------------------------------------------------------------------
    async def run(self, board: TaskBoard, run_id: str, policy: RoundPolicy) -> SecureSum:
        """The protocol's steps; SecAggAbort (the round fails) when one ends with too few devices."""
        try:
            return await self._run(board, run_id, policy)
        except SecAggAbort as exc:
            self.failed = str(exc)
            await self.changed_now()
            raise

    async def _run(self, board: TaskBoard, run_id: str, policy: RoundPolicy) -> SecureSum:
        s, timeout = self.session, self.config.phase_timeout_s
        # Step 0 (a device's keys are its answer) waits as a round without secure aggregation does: up to
        # max_retries more deadlines while fewer than the quorum (min_fraction) answered, then goes on with those
        # that did (the protocol's threshold t then decides). Only step 0 can wait again: once the roster is
        # closed, the later steps' sets are fixed by it (docs/decisions/secagg-shamir.md). With policy.answers = K,
        # it closes at the K-th device's keys: those devices are the roster U1 (t is a share of them), and a later
        # device's keys are refused (409) and its update dropped, never masked into the sum.
        enough, quorum = policy.enough(len(self.tasks)), policy.quorum(len(self.tasks))
        for attempt in range(policy.max_retries + 1):
            answered = await board.wait_results(run_id, policy.deadline_s, enough=enough)
            if len(answered) >= quorum:
                break
            if attempt < policy.max_retries:
                log.warning("secure round %s: keys from %d of %d devices (quorum %d); waiting again (retry %d of %d)",
                            self.name, len(answered), len(self.tasks), quorum, attempt + 1, policy.max_retries)
        results = {r.client_id: r for r in answered}
        roster = s.close_keys()
        self.weights = {k: int(self.algorithm.client_weight(results[k].num_samples)) for k in roster}
        try:
            fixedpoint.check_capacity(sum(self.weights.values()), self.config.clip, self.config.scale_bits,
                                      self.config.bits)
        except fixedpoint.CapacityExceeded as exc:
            raise SecAggAbort(str(exc)) from exc
        await self._close(1, "keys", len(roster), len(self.tasks))
        await wait_until(self.changed, lambda: len(s.ciphertexts) == len(roster), timeout)
        survivors = s.close_shares()
        await self._close(2, "shares", len(survivors), len(roster))
        await wait_until(self.changed, lambda: len(s.masked) == len(survivors), timeout)
        remaining = s.close_masked()
        await self._close(3, "masked inputs", len(remaining), len(survivors))
        await wait_until(self.changed, lambda: len(s.responses) == len(remaining), timeout)
        total = await asyncio.to_thread(s.total)
        sums = fixedpoint.decode(total, self.layout, self.config.scale_bits, self.config.bits)
        kept = [results[k] for k in remaining]
        return SecureSum(sums, float(sum(self.weights[k] for k in remaining)), kept)

    async def _close(self, step: int, what: str, arrived: int, asked: int) -> None:
        log.info("secure round %s: %s from %d of %d devices", self.name, what, arrived, asked)
        self.step = step
        await self.changed_now()


async def collect_secure(board: TaskBoard, rounds: dict[str, SecureRound], name: str, tasks: list[Task],
                         algorithm: Algorithm, policy: RoundPolicy, failures: list[ClientFailure]) -> SecureSum:
    """Posts the round's tasks and runs the protocol over them; the tasks and the session go when it ends (the
    failures the devices reported join `failures`)."""
    run_id = tasks[0].header.run_id
    secure = rounds[run_id] = SecureRound(name, tasks, algorithm)
    await board.post(tasks)
    try:
        return await secure.run(board, run_id, policy)
    finally:
        if secure.failed is None:  # over (or cancelled): devices still waiting on a step hear 409
            secure.failed = "the round is over"
            await secure.changed_now()
        if rounds.get(run_id) is secure:
            del rounds[run_id]
        failures.extend(board.failures(run_id))
        await board.clear(run_id)
