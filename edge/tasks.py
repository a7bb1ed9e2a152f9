"""The edge's task board: one open task per selected client, fetched by long-poll, answered once.

A task keeps its id across re-runs of a round, so a client that restarts (or a retried upload) meets
the same task; results are checked against the algorithm's result spec before they are accepted.
"""
from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Callable

from fl_services.shared.core.algorithms.base import ClientResult
from fl_services.shared.core.federation import device_evaluates
from fl_services.shared.core.late import LateAnswer
from fl_services.shared.core.records import Record, flatten
from fl_services.shared.core.reports import ClientFailure, FailureKind, HeldOut, ReportedFailure
from fl_services.shared.core.tensors import InvalidContent, SharedEncoding
from fl_services.shared.server.longpoll import wait_until
from fl_services.shared.wire.client_edge import (
    ClientFailureReport,
    ClientRegistration,
    ClientResultHeader,
    ClientTaskHeader,
)


class TaskConflict(Exception):
    """A stale or duplicate result (HTTP 409)."""

    def __init__(self, message: str, reason: str):
        super().__init__(message)
        self.reason = reason  # "stale" or "duplicate": the refusal's name in the metrics (edge/metrics.py)


class UnknownClient(Exception):
    """A client id that never registered (HTTP 404)."""


class ForeignClient(Exception):
    """A client id this edge does not serve in the current run (HTTP 409)."""


@dataclass
class Task:
    header: ClientTaskHeader
    tensors: Record
    check: Callable[[Record], None]  # the algorithm's check_result for this task; raises InvalidContent
    result: ClientResult | None = None
    # What the client reported when it could not train the task; a later result still answers it (the
    # client process restarted with what it lacked).
    failure: str | None = None
    failure_kind: ReportedFailure = "training"
    # The client's training sample count where the edge knows it (shared.core.federation.known_num_samples): a
    # result must claim exactly this. Where it does not, `max_samples` (the edge's max_client_samples) caps
    # what a claim weighs. Unchecked, one device claiming 10^12 samples would take 0.999999999 of the weight.
    num_samples: int | None = None
    max_samples: int | None = None
    # The tensors' encoding, shared by every task of the round that sends the same tensors (TaskBoard.post).
    encoding: SharedEncoding | None = field(default=None, repr=False)
    _blob: bytes | None = field(default=None, repr=False)  # fixed bytes to send instead (tests: a malformed task)

    def counted_samples(self, claimed: int) -> int:
        """The sample count the result's weight uses; raises InvalidContent (422) for a wrong claim."""
        if self.num_samples is not None and claimed != self.num_samples:
            raise InvalidContent(f"num_samples {claimed} is not client {self.header.client_id}'s: this run gives it "
                                 f"{self.num_samples} training samples")
        return claimed if self.max_samples is None else min(claimed, self.max_samples)

    def check_evaluation(self, evaluation: HeldOut | None) -> None:
        """Raises InvalidContent (422) for an evaluation the task did not ask for: the run evaluates on the cloud
        only, or the task is of a later edge round, whose model is the edge's, not the global one."""
        if evaluation is not None and not device_evaluates(self.header.config, self.header.round):
            raise InvalidContent(f"task {self.header.task_id!r} asks for no evaluation: run evaluation is "
                                 f"{self.header.config.evaluation!r}, client round {self.header.round}")

    def blob(self) -> bytes:
        """The task message."""
        return b"".join(self.parts())

    def parts(self) -> tuple[bytes, bytes]:
        """The task message as its head and its data (SharedEncoding.parts). The tensors are encoded on the
        first fetch of any task sharing them, not at dispatch, and not kept per task: a thousand tasks of
        one round cost one encoding and no copies."""
        if self._blob is not None:
            return self._blob, b""
        if self.encoding is None:
            self.encoding = SharedEncoding(flatten(self.tensors))
        return self.encoding.parts(self.header)


# How soon a round waiting for answers sees that a device it waits for went offline.
DEPARTURES_SEEN_S = 1.0


class TaskBoard:
    """The open tasks of every run the edge serves: a client may hold one task per run at once, and fetches
    them oldest first, so a client shared by several runs serves them in turn.

    Two kinds of waiters, woken separately: fetches (one per long-polling client, or per client process)
    wait for tasks of their own clients and are woken only when one is posted for them, so posting a
    round's tasks to 1,000 waiters wakes each once and re-checks nothing else; the rounds wait for
    answers (`_answered`), which no fetch cares about.
    """

    def __init__(self, offline_after_s: float = math.inf) -> None:
        # The device registry: every client registered here (its labels and data summary), and when it was last
        # heard from (registration, task poll, result), seconds since the epoch.
        self.clients: dict[int, ClientRegistration] = {}
        # A device not heard from for offline_after_s is offline: it is in no round that starts meanwhile.
        self.offline_after_s = offline_after_s
        # Set when what the site reports changes between its periodic reports (a device registers, comes back or
        # goes offline; a run ends here): what the cloud's site registry hears soon.
        self.site_changed = asyncio.Event()
        self.registered_at: dict[int, float] = {}
        # The id of the device token each device registered with (none: the edge's client secret), so that revoking
        # that token takes the device out of the runs' members.
        self.token_ids: dict[int, str] = {}
        self.last_seen: dict[int, float] = {}
        self._receiving: dict[int, int] = {}  # client_id -> its result uploads arriving now
        self._tasks: dict[str, dict[int, Task]] = {}  # run_id -> client_id -> task
        self._posted: dict[tuple[str, int], int] = {}  # (run_id, client_id) -> when its task was posted
        self._posts = 0
        self._answered = asyncio.Condition()
        self._waiting: dict[int, set[asyncio.Event]] = {}  # client_id -> the fetches waiting for its tasks
        self._closing = False
        self.last_post = 0.0  # time.time() of the last post (bench/scale.py: posting to every client holding)

    # ---- clients -------------------------------------------------------------------------------
    def register(self, reg: ClientRegistration, token_id: str | None = None) -> None:
        now = time.time()
        self.clients[reg.client_id] = reg
        if token_id is None:
            self.token_ids.pop(reg.client_id, None)
        else:
            self.token_ids[reg.client_id] = token_id
        self.registered_at.setdefault(reg.client_id, now)
        self.last_seen[reg.client_id] = now
        self.site_changed.set()

    def seen(self, client_ids: Iterable[int]) -> None:
        now = time.time()
        for k in client_ids:
            if k in self.clients:
                if self.offline(k, now):
                    self.site_changed.set()
                self.last_seen[k] = now

    def offline(self, client_id: int, now: float) -> bool:
        """Whether the device has not been heard from for offline_after_s (one uploading a result is heard)."""
        return now - self.last_seen.get(client_id, now) > self.offline_after_s and not self.uploading(client_id)

    async def watch_departures(self, batch_s: float) -> None:
        """Sets site_changed when a device goes offline, looking again when the next one would if it stays silent
        (at most every `batch_s`: the departures meanwhile are seen at once)."""
        if math.isinf(self.offline_after_s):
            return
        checked = time.time()
        while True:
            now = time.time()
            departures = [t + self.offline_after_s for t in self.last_seen.values()]
            if any(checked < d <= now for d in departures):
                self.site_changed.set()
            checked = now
            upcoming = min((d for d in departures if d > now), default=now + self.offline_after_s)
            await asyncio.sleep(max(upcoming - now, batch_s))

    def keep_only(self, client_ids: set[int]) -> None:
        """Forgets the registrations of other clients (they hear 404, register again and are refused)."""
        self.clients = {k: reg for k, reg in self.clients.items() if k in client_ids}
        self.registered_at = {k: t for k, t in self.registered_at.items() if k in client_ids}
        self.last_seen = {k: t for k, t in self.last_seen.items() if k in client_ids}
        self.token_ids = {k: t for k, t in self.token_ids.items() if k in client_ids}

    def devices(self, revoked: frozenset[str]) -> dict[int, ClientRegistration]:
        """The devices a round may take now: the registered ones but those offline and those whose device token is
        `revoked`. An offline device given a task would take a place in the round (a selection's) and not answer."""
        now = time.time()
        return {k: reg for k, reg in self.clients.items()
                if self.token_ids.get(k) not in revoked and not self.offline(k, now)}

    def activity(self) -> tuple[dict[int, list[str]], dict[int, tuple[str, str, FailureKind]]]:
        """Per client: the runs whose task for it is open (posted, neither answered nor reported failed), and the
        run, reason and kind of a failure it reported among the tasks still on the board. One pass over the board,
        so that a registry of 10,000 devices is read without a look per device."""
        open_runs: dict[int, list[str]] = {}
        failures: dict[int, tuple[str, str, FailureKind]] = {}
        for run_id, tasks in self._tasks.items():
            for client_id, t in tasks.items():
                if t.failure is not None:
                    failures.setdefault(client_id, (run_id, t.failure, t.failure_kind))
                elif t.result is None:
                    open_runs.setdefault(client_id, []).append(run_id)
        return open_runs, failures

    @contextmanager
    def receiving(self, client_id: int) -> Iterator[None]:
        """Marks the client as uploading while its result's body arrives (a large model takes a while)."""
        self._receiving[client_id] = self._receiving.get(client_id, 0) + 1
        try:
            yield
        finally:
            left = self._receiving.pop(client_id) - 1
            if left:
                self._receiving[client_id] = left

    def uploading(self, client_id: int) -> bool:
        return client_id in self._receiving

    def tallies(self) -> list[tuple[str, int, int, int, int]]:
        """Per run on the board: (run_id, the version its round trains, its tasks, answered, reported failed and
        not answered), of the run's newest round (not its late tasks, policy.late = 'join')."""
        tallies = []
        for run_id, tasks in sorted(self._tasks.items()):
            version = max(t.header.version for t in tasks.values())
            newest = [t for t in tasks.values() if t.header.version == version]
            tallies.append((run_id, version, len(newest), sum(t.result is not None for t in newest),
                            sum(t.result is None and t.failure is not None for t in newest)))
        return tallies

    def _known(self, client_id: int) -> None:
        if client_id not in self.clients:
            raise UnknownClient(f"unknown client {client_id}; register first")

    # ---- round side ----------------------------------------------------------------------------
    async def post(self, tasks: list[Task], keep_late: bool = False) -> None:
        """A round's tasks, replacing the previous ones of their run; with `keep_late`, but its tasks of older
        versions, whose answers may still join a later round (policy.late = 'join')."""
        shared: dict[tuple[tuple[str, int], ...], SharedEncoding] = {}
        async with self._answered:
            for run_id in {t.header.run_id for t in tasks}:
                version = min(t.header.version for t in tasks if t.header.run_id == run_id)
                self._drop(run_id, partial(_older, version) if keep_late else None)
            for t in tasks:
                if t.encoding is None:  # the same tensor objects (FedAvg's global state): one encoding
                    flat = flatten(t.tensors)
                    key = tuple((name, id(tensor)) for name, tensor in flat.items())
                    t.encoding = shared.get(key) or shared.setdefault(key, SharedEncoding(flat))
                self._tasks.setdefault(t.header.run_id, {})[t.header.client_id] = t
                self._posts += 1
                self._posted[(t.header.run_id, t.header.client_id)] = self._posts
            self.last_post = time.time()
            self._answered.notify_all()
        self._wake(t.header.client_id for t in tasks)

    async def clear(self, run_id: str | None = None, keep: Callable[[Task], bool] | None = None) -> None:
        """Drops the run's tasks (None: every run's), but those `keep` takes."""
        async with self._answered:
            for run in [run_id] if run_id is not None else list(self._tasks):
                self._drop(run, keep)

    def _drop(self, run_id: str, keep: Callable[[Task], bool] | None = None) -> None:
        tasks = self._tasks.pop(run_id, {})
        kept = {k: t for k, t in tasks.items() if keep is not None and keep(t)}
        for client_id in tasks.keys() - kept.keys():
            del self._posted[(run_id, client_id)]
        if kept:
            self._tasks[run_id] = kept

    def _of(self, run_id: str | None, version: int | None = None) -> list[tuple[int, Task]]:
        """The (client_id, task) of the run (None: of every run), of its round on `version` if given."""
        runs = [self._tasks.get(run_id, {})] if run_id is not None else list(self._tasks.values())
        return [(k, t) for tasks in runs for k, t in tasks.items() if version is None or t.header.version == version]

    def late_clients(self, run_id: str, version: int) -> set[int]:
        """The clients holding a task of the run older than `version` (policy.late = 'join'): busy."""
        return {k for k, t in self._of(run_id) if t.header.version < version}

    async def take_late(self, run_id: str, version: int) -> tuple[list[LateAnswer], list[ClientFailure]]:
        """The run's tasks older than `version` that were answered, or reported failed, since their rounds closed,
        taken off the board (policy.late = 'join'); the others stay open."""
        async with self._answered:
            done = [(k, t) for k, t in self._of(run_id) if t.header.version < version
                    and (t.result is not None or t.failure is not None)]
            self._drop(run_id, lambda t: all(t is not d for _, d in done))
        return ([LateAnswer(t.header.version, t.result) for _, t in done if t.result is not None],
                [ClientFailure(client_id=k, error=t.failure, kind=t.failure_kind) for k, t in done
                 if t.result is None and t.failure is not None])

    async def close(self) -> None:
        """The edge is stopping: every waiting and future fetch answers "no task" at once."""
        async with self._answered:
            self._closing = True
            self._answered.notify_all()
        self._wake(list(self._waiting))

    def outstanding(self) -> int:
        """Tasks posted and not answered yet, of every run."""
        return sum(1 for _, t in self._of(None) if t.result is None)

    def results(self, run_id: str | None = None, version: int | None = None) -> list[ClientResult]:
        """The results received for the run's tasks (None: every run's), of its round on `version` if given."""
        return [t.result for _, t in self._of(run_id, version) if t.result is not None]

    def failures(self, run_id: str | None = None, version: int | None = None) -> list[ClientFailure]:
        return [ClientFailure(client_id=k, error=t.failure, kind=t.failure_kind)
                for k, t in sorted(self._of(run_id, version), key=lambda x: x[0])
                if t.result is None and t.failure is not None]

    def unanswered(self, run_id: str, version: int, deadline: str) -> list[ClientFailure]:
        """The round's tasks neither answered nor reported failed, as failures of kind offline (the device went
        silent) or timeout (it did not answer by the `deadline`, which the error text names)."""
        now = time.time()
        return [ClientFailure(client_id=k, kind="offline",
                              error=f"offline: not heard from for over {self.offline_after_s:g} s while its task was "
                                    "open") if self.offline(k, now) else
                ClientFailure(client_id=k, kind="timeout", error=f"no answer by the round's deadline ({deadline})")
                for k, t in sorted(self._of(run_id, version), key=lambda x: x[0])
                if t.result is None and t.failure is None]

    async def wait_results(self, run_id: str, timeout: float, failures_settle: bool = True,
                           enough: int | None = None, version: int | None = None) -> list[ClientResult]:
        """Returns when every task of the run (of its round on `version`, if given) is answered (or, if
        `failures_settle`, reported failed or its device gone offline: no point waiting for those), or `enough`
        of them are, or at the deadline, with what has arrived. A device back online meanwhile may still answer
        until the round closes. Nothing announces a device going offline (it is silence, and the moment may
        pass during an upload that then fails), so the wait looks again every `DEPARTURES_SEEN_S` as well."""
        def done() -> bool:
            tasks, now = self._of(run_id, version), time.time()
            return (enough is not None and sum(t.result is not None for _, t in tasks) >= enough) or all(
                t.result is not None or (failures_settle and (t.failure is not None or self.offline(k, now)))
                for k, t in tasks)

        await wait_until(self._answered, done, timeout,
                         recheck_s=DEPARTURES_SEEN_S if math.isfinite(self.offline_after_s) else math.inf)
        return self.results(run_id, version)

    # ---- client side ---------------------------------------------------------------------------
    async def fetch(self, client_id: int, timeout: float) -> Task | None:
        """The client's open task posted first, whichever its run; waits up to `timeout` for one."""
        self._known(client_id)
        self.seen([client_id])
        found = await self._wait_for_tasks([client_id], lambda: self._open_tasks(client_id)[:1], timeout)
        return found[0] if found else None

    async def fetch_many(self, client_ids: list[int], holding: set[str], timeout: float) -> list[Task]:
        """Every open task of the known clients among `client_ids` but those in `holding` (a client process's
        batch long-poll), oldest first; waits up to `timeout` for one. A task in `holding` posted again after the
        poll began (a failed round re-run with the same task ids) is handed out all the same: the process may have
        finished it meanwhile, and would otherwise learn of it only at its next poll, a long-poll later."""
        self.seen(client_ids)
        since = self._posts
        def ready() -> list[Task]:
            found = [t for k in client_ids if k in self.clients for t in self._open_tasks(k)
                     if t.header.task_id not in holding or self._posted[(t.header.run_id, k)] > since]
            return sorted(found, key=lambda t: self._posted[(t.header.run_id, t.header.client_id)])
        return await self._wait_for_tasks(client_ids, ready, timeout)

    async def _wait_for_tasks(self, client_ids: list[int], ready: Callable[[], list[Task]],
                              timeout: float) -> list[Task]:
        """`ready()` once it is not empty, or at the deadline (or when the edge closes), re-checked only
        when a task is posted for one of `client_ids`."""
        deadline = time.monotonic() + timeout
        woken = asyncio.Event()
        for k in client_ids:
            self._waiting.setdefault(k, set()).add(woken)
        try:
            while True:
                woken.clear()
                found = ready()
                remaining = deadline - time.monotonic()
                if found or self._closing or remaining <= 0:
                    return found
                try:
                    async with asyncio.timeout(remaining):
                        await woken.wait()
                except TimeoutError:
                    pass
        finally:
            for k in client_ids:
                waiters = self._waiting.get(k)
                if waiters is not None:
                    waiters.discard(woken)
                    if not waiters:
                        del self._waiting[k]

    def _wake(self, client_ids: Iterable[int]) -> None:
        for k in client_ids:
            for woken in self._waiting.get(k, ()):
                woken.set()

    def _open_tasks(self, client_id: int) -> list[Task]:
        """The client's open tasks, whichever their run, posted first first. A task it reported failed is not
        handed out again (it would fail again): as the oldest, it held back the client's other runs' tasks."""
        open_tasks = [(self._posted[(run_id, client_id)], task) for run_id, tasks in self._tasks.items()
                      if (task := tasks.get(client_id)) is not None and task.result is None and task.failure is None]
        return [task for _, task in sorted(open_tasks, key=lambda x: x[0])]

    def task_for(self, client_id: int, task_id: str) -> Task:
        """The open task a result answers; raises for unknown, stale or duplicate results."""
        self._known(client_id)
        task = next((t for tasks in self._tasks.values() if (t := tasks.get(client_id)) is not None
                     and t.header.task_id == task_id), None)
        if task is None:
            raise TaskConflict(f"stale result: task {task_id!r} is not open for client {client_id}", "stale")
        if task.result is not None:
            raise TaskConflict(f"duplicate result for task {task_id!r}", "duplicate")
        return task

    async def accept(self, client_id: int, header: ClientResultHeader, tensors: Record) -> None:
        """Checks a result on a worker thread (CPU-bound: it reads every value), then records it on the loop,
        which alone touches the board, if its task is still the open one."""
        task = self.admissible(client_id, header)  # a wrong claim is refused before the tensors are read
        while True:
            await asyncio.to_thread(task.check, tensors)
            async with self._answered:
                # Anything may have happened during the check: an identical retry answered the task (409
                # duplicate), the round ended (409 stale), or it was posted again with the same task id.
                current = self.task_for(client_id, header.task_id)
                if current is task:
                    self._record(task, client_id, header, tensors)
                    self._answered.notify_all()
                    return
            task = current  # posted again while the check ran: check against the task now open

    async def accept_many(self, results: list[tuple[int, ClientResultHeader, Record]]) -> list[Exception | None]:
        """`accept` for many results at once (a client process's result bundle), each on its own: what refused
        each (InvalidContent, TaskConflict or UnknownClient), None for those accepted. Their checks run in one
        worker-thread hop, and they are recorded under one acquisition of the board."""
        outcomes: list[Exception | None] = [None] * len(results)
        admitted: dict[int, Task] = {}
        for i, (client_id, header, _) in enumerate(results):
            try:
                admitted[i] = self.admissible(client_id, header)
            except (InvalidContent, TaskConflict, UnknownClient) as exc:
                outcomes[i] = exc

        def check_all() -> None:
            for i, task in admitted.items():
                try:
                    task.check(results[i][2])
                except InvalidContent as exc:
                    outcomes[i] = exc

        await asyncio.to_thread(check_all)
        moved = []  # posted again while the checks ran: checked again, one by one, against the task now open
        async with self._answered:
            for i, task in admitted.items():
                client_id, header, tensors = results[i]
                if outcomes[i] is not None:
                    continue
                try:
                    current = self.task_for(client_id, header.task_id)  # e.g. the same result twice in one bundle
                except (TaskConflict, UnknownClient) as exc:
                    outcomes[i] = exc
                    continue
                if current is task:
                    self._record(task, client_id, header, tensors)
                else:
                    moved.append(i)
            self._answered.notify_all()
        for i in moved:
            try:
                await self.accept(*results[i])
            except (InvalidContent, TaskConflict, UnknownClient) as exc:
                outcomes[i] = exc
        return outcomes

    @staticmethod
    def _record(task: Task, client_id: int, header: ClientResultHeader, tensors: Record) -> None:
        task.result = ClientResult(client_id, task.counted_samples(header.num_samples), header.loss, tensors,
                                   header.metrics, header.device, header.evaluation)

    def admissible(self, client_id: int, header: ClientResultHeader) -> Task:
        """The open task a result answers, its header's claims checked (sample count, evaluation); raises as
        task_for does, or InvalidContent."""
        task = self.task_for(client_id, header.task_id)
        task.counted_samples(header.num_samples)
        task.check_evaluation(header.evaluation)
        return task

    async def accept_secure(self, client_id: int, header: ClientResultHeader) -> None:
        """Records a device's result under secure aggregation: its header only (the update comes masked, to the
        round's protocol, edge/secagg.py), which answers its task. Its evaluation (federated evaluation) comes in
        clear with it: a figure of the global model on the device's held-out split, not its update."""
        async with self._answered:
            task = self.admissible(client_id, header)
            task.result = ClientResult(client_id, task.counted_samples(header.num_samples), header.loss, {},
                                       header.metrics, header.device, header.evaluation)
            self._answered.notify_all()

    async def report_failure(self, client_id: int, report: ClientFailureReport) -> bool:
        """Records that the client could not train its open task (409 if stale or already answered); False, the
        first reason kept, if it already reported that task failed (a repeated report changes nothing)."""
        async with self._answered:
            task = self.task_for(client_id, report.task_id)
            if task.failure is not None:
                return False
            task.failure, task.failure_kind = report.error, report.kind
            self._answered.notify_all()
            return True


def _older(version: int, task: Task) -> bool:
    return task.header.version < version
