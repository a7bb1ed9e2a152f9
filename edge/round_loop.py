"""The edge loop, written once: fetch global → select → dispatch → collect → edge_aggregate → submit.

It runs as a background task of the edge app and only ever dials out to the cloud; every run that
includes this edge has its own rounds (a `Lane`), fed by one long-poll.
"""
from __future__ import annotations

import asyncio
import logging
import math
import os
import time
from collections.abc import Awaitable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import httpx

from fl_services.edge.config import EdgeSettings
from fl_services.edge.metrics import EdgeMetrics
from fl_services.edge.pacing import EdgePacing
from fl_services.edge.tasks import ForeignClient, Task, TaskBoard
from fl_services.shared.core.algorithms import registry
from fl_services.shared.core.algorithms.base import Algorithm, ClientResult
from fl_services.shared.core.config import RoundPolicy, RunConfig
from fl_services.shared.core.edge_round import ClientTask, run_edge_round
from fl_services.shared.core.federation import known_num_samples, participation
from fl_services.shared.core.records import Record, decode, decode_state, encode
from fl_services.shared.core.reports import ClientFailure, EdgeContributionHeader
from fl_services.shared.core.tensors import PayloadError
from fl_services.shared.runtime.files import atomic_write
from fl_services.shared.runtime.log import bind
from fl_services.shared.wire.backoff import Backoff
from fl_services.shared.wire.client_edge import ClientTaskHeader
from fl_services.shared.wire.edge_cloud import EdgeRegistration, GlobalStateHeader, RunEnd
from fl_services.shared.wire.http import binary_body
from fl_services.shared.wire.protocol import live_runs
from fl_services.shared.wire.retry import DEDUPLICATED

log = logging.getLogger(__name__)


class RoundAbandoned(Exception):
    """The cloud moved on while the round waited for clients that cannot answer."""


@dataclass
class Lane:
    """One run as this edge serves it: its algorithm, its edge state, and its round in progress."""

    config: RunConfig
    algorithm: Algorithm
    edge_state: Record
    backoff: Backoff
    # DVFS: the budget each task gives its client, from this run's rounds (edge/pacing.py).
    pacing: EdgePacing
    # The last version whose round succeeded: the long-poll asks for a newer one. It moves only after a
    # successful round, so after a failure the same state (or a newer one, if the cloud moved on) is
    # fetched again and its round re-run, instead of the edge waiting for a version that never comes.
    done: int = -1
    # The round in progress (or the wait after a failed one): the run is not offered again meanwhile.
    task: asyncio.Task | None = None
    # The clients' sample counts as the edge derives them from the run (None: it cannot know them).
    num_samples: list[int] | None = None
    samples_known: bool = False


class EdgeRoundLoop:
    """Serves every run this edge takes part in: one long-poll fetches the global states of all of them,
    and each run's rounds go on in their own task, so one run's slow round holds back no other run."""

    # Wait before re-running a failed round: doubles after each failure up to the cap, back to the start on success.
    retry_backoff_s: float = 1.0
    retry_backoff_max_s: float = 30.0

    def __init__(self, settings: EdgeSettings, cloud: httpx.AsyncClient, board: TaskBoard,
                 metrics: EdgeMetrics | None = None):
        self.settings = settings
        self.metrics = metrics or EdgeMetrics()
        self.cloud = cloud
        self.board = board
        self.edge_id = settings.edge_id
        self.current: GlobalStateHeader | None = None  # the last round started, of any run
        self.lanes: dict[str, Lane] = {}
        self._lanes_changed = asyncio.Event()
        self._live: set[str] | None = None  # the live runs the last long-poll answer named

    async def run_forever(self) -> None:
        await self.register()
        backoff = Backoff(self.retry_backoff_s, self.retry_backoff_max_s)
        poll: asyncio.Task[httpx.Response] | None = None
        try:
            while True:
                if poll is None:
                    self._lanes_changed.clear()
                    poll = asyncio.create_task(self._poll(self.settings.long_poll_max_s))
                changed = asyncio.create_task(self._lanes_changed.wait())
                try:
                    await asyncio.wait({poll, changed}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    changed.cancel()
                if not poll.done():
                    # A round ended: poll again saying so (a state this poll brings meanwhile is offered again).
                    poll.cancel()
                    await asyncio.wait({poll})  # a cancel of this loop itself still propagates
                    if not poll.cancelled():
                        poll.exception()  # retrieved: a failure of an abandoned poll is of no interest
                    poll = None
                    continue
                done, poll = poll, None
                try:
                    await self._received(done.result())
                    backoff.reset()
                except asyncio.CancelledError:
                    raise
                except Exception:
                    delay = backoff.next()
                    log.exception("edge %d: fetching a global state failed; retrying in %g s", self.edge_id, delay)
                    await asyncio.sleep(delay)
        finally:
            for task in [poll, *(lane.task for lane in self.lanes.values())]:
                if task is not None:
                    task.cancel()

    async def _received(self, response: httpx.Response) -> None:
        """One long-poll's answer: forgets the runs that ended, starts the round of the state it brings."""
        if response.status_code == 404:  # the cloud lost our registration (fresh Redis)
            await self.register()
            return
        response.raise_for_status()
        live = live_runs(response.headers)
        if live is not None:
            self._forget_ended(live)
        if response.status_code == 204:
            return
        global_, header = await asyncio.to_thread(decode, response.content, GlobalStateHeader)
        lane = self.lane(header)
        if lane.task is None:
            lane.task = asyncio.create_task(self._serve(lane, header, global_))

    @property
    def live_runs(self) -> set[str] | None:
        """The runs the cloud last named live for this edge; None until it has named any."""
        return self._live

    def _forget_ended(self, live: set[str]) -> None:
        """Drops the runs that are no longer running or paused, abandoning their rounds, and their state files."""
        for run_id in set(self.lanes) - live:
            lane = self.lanes.pop(run_id)
            if lane.task is not None:
                log.info("edge %d: run %s ended; dropping its round", self.edge_id, run_id)
                lane.task.cancel()
        if live != self._live:
            self._live = live
            self._drop_ended_states(live)

    def _drop_ended_states(self, live: set[str]) -> None:
        """Deletes this edge's state files of the runs that are not live: an ended run never resumes, and
        each file (every client's memory of the run) outlived even the run's deletion at the cloud. Those
        of runs that ended while the edge was down go too."""
        if self.settings.state_dir is None or not self.settings.state_dir.is_dir():
            return
        prefix = f"edge{self.edge_id}-"
        for path in self.settings.state_dir.glob(f"{prefix}*.safetensors"):
            if path.name.removeprefix(prefix).removesuffix(".safetensors") not in live:
                path.unlink(missing_ok=True)

    async def _serve(self, lane: Lane, header: GlobalStateHeader, global_: Record) -> None:
        """One run's round; a failed one is re-run after a backoff (from the same state, or a newer one)."""
        try:
            await self.until_run_ends(header, self.run_round(header, global_))
        except RoundAbandoned as exc:
            log.warning("edge %d: round abandoned: %s", self.edge_id, exc)
        except Exception:  # not a cancellation: a stop or an ended run ends the round for good
            delay = lane.backoff.next()
            log.exception("edge %d: round at version %d of run %s failed; re-running it in %g s",
                          self.edge_id, header.version, header.run_id, delay)
            await asyncio.sleep(delay)
        else:
            lane.done = header.version
            lane.backoff.reset()
        finally:
            lane.task = None
            self._lanes_changed.set()

    async def _poll(self, timeout: float, run: tuple[str, int] | None = None) -> httpx.Response:
        """The cloud's long-poll: 200 with a global state of a run this edge takes part in that it has not
        done yet, 204 if none comes within `timeout` (or a run it knows ended). With `run`, only that run
        newer than that version."""
        params: dict[str, float | str | list[str]]
        if run is not None:
            params = {"seen": [f"{run[0]}:{run[1]}"], "others": "false"}
        else:
            params = {"seen": [f"{run_id}:{lane.done}" for run_id, lane in self.lanes.items() if lane.task is None],
                      "busy": [run_id for run_id, lane in self.lanes.items() if lane.task is not None]}
        params["timeout"] = timeout
        return await self.cloud.get(f"/api/v1/edges/{self.edge_id}/global", params=params)

    async def until_run_ends(self, header: GlobalStateHeader, round_: Awaitable[None]) -> None:
        """Runs the round while watching the cloud's end signal for its run: if the run is stopped (or
        finishes, or is deleted) meanwhile, the round is dropped at once (its tasks withdrawn, so clients
        stop training for it) and RoundAbandoned raised; without this the edge waited out the round's
        deadline, up to a day, before the next run could use it."""
        round_task = asyncio.ensure_future(round_)
        end_task = asyncio.create_task(self._run_end(header.run_id))
        try:
            await asyncio.wait({round_task, end_task}, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:  # cancelled: the edge is stopping
            for task in (round_task, end_task):
                task.cancel()
            await asyncio.gather(round_task, end_task, return_exceptions=True)
            raise
        if round_task.done():
            end_task.cancel()
            await asyncio.gather(end_task, return_exceptions=True)
            return round_task.result()
        round_task.cancel()
        await asyncio.gather(round_task, return_exceptions=True)
        end = end_task.result()
        self.current = None
        raise RoundAbandoned(f"run {end.run_id} was {end.status} during version {header.version}; "
                             "its round is dropped")

    async def _run_end(self, run_id: str) -> RunEnd:
        """The cloud's answer once `run_id` no longer trains; waits (long-polls) until then. Failures to ask
        (the cloud away, a cloud without this route) are retried after a backoff: never a reason to drop
        a round."""
        backoff = Backoff(self.retry_backoff_s, self.retry_backoff_max_s, jitter=0.5)
        while True:
            try:
                response = await self.cloud.get(f"/api/v1/edges/{self.edge_id}/runs/{run_id}/end",
                                                params={"timeout": self.settings.long_poll_max_s})
                if response.status_code == 200:
                    return RunEnd.model_validate_json(response.content)
                if response.status_code == 204:
                    backoff.reset()
                    continue
            except (httpx.HTTPError, ValueError):
                pass
            await asyncio.sleep(backoff.next())

    async def register(self) -> None:
        reg = EdgeRegistration(edge_id=self.edge_id, url=self.settings.public_url)
        # Re-sent through a passing fault: a registration repeated replaces itself.
        response = await self.cloud.post("/api/v1/edges", json=reg.model_dump(), extensions=DEDUPLICATED)
        response.raise_for_status()
        log.info("edge %d registered with the cloud", self.edge_id)

    def _own_clients(self) -> set[int]:
        return {k for lane in self.lanes.values() for k in lane.config.clients_of_edge(self.edge_id)}

    def check_own_client(self, client_id: int) -> None:
        """Raises ForeignClient for a client this edge serves in none of the runs it knows (none yet: any)."""
        if not self.lanes or client_id in self._own_clients():
            return
        raise ForeignClient("; ".join(
            f"client {client_id} is not a client of edge {self.edge_id} in run {run_id}: edge {self.edge_id} "
            f"serves the clients k < {lane.config.data.num_clients} with k mod {lane.config.topology.num_edges} "
            f"= {self.edge_id}" for run_id, lane in self.lanes.items()))

    def lane(self, header: GlobalStateHeader) -> Lane:
        """The run's lane, made on its first state (its edge state read back from disk)."""
        lane = self.lanes.get(header.run_id)
        if lane is None:
            lane = Lane(header.config, registry.create(header.config), self._load_state(header.run_id),
                        Backoff(self.retry_backoff_s, self.retry_backoff_max_s),
                        EdgePacing(self.edge_id, header.run_id))
            self.lanes[header.run_id] = lane
        return lane

    def _state_path(self, run_id: str) -> Path | None:
        if self.settings.state_dir is None:
            return None
        return self.settings.state_dir / f"edge{self.edge_id}-{run_id}.safetensors"

    def _load_state(self, run_id: str) -> Record:
        path = self._state_path(run_id)
        if path is None or not path.exists():
            return {}
        try:
            return decode_state(path.read_bytes())
        except PayloadError:
            # Unreadable (e.g. a disk that lost its last write): start afresh, loudly, and keep the file.
            log.error("edge %d: state file %s is unreadable; starting run %s without it", self.edge_id, path, run_id)
            os.replace(path, path.with_suffix(".corrupt"))
            return {}

    def _save_state(self, run_id: str, state: Record) -> None:
        """Atomically, so a crash leaves the previous state or this one. Saved before the submit: an
        edge that restarts re-runs the round, its clients answer from their saved results, and the
        incremental aggregation replaces each client's prototype, so nothing is counted twice."""
        path = self._state_path(run_id)
        if path is None:
            return
        atomic_write(path, encode(state))

    async def run_round(self, header: GlobalStateHeader, global_: Record) -> None:
        self.current = header
        bind(run_id=header.run_id)
        lane = self.lane(header)
        # Before any run was known, any client id could register; now the runs say which are this edge's.
        self.board.keep_only(self._own_clients())
        algorithm = lane.algorithm
        if not lane.samples_known:
            lane.num_samples, lane.samples_known = await asyncio.to_thread(self._known_num_samples, header), True
        failures: list[ClientFailure] = []  # of every edge round
        pacing = lane.pacing
        pacing.heard(header)

        async def train(tasks: list[ClientTask]) -> list[ClientResult]:
            chosen = [t.client_id for t in tasks]
            budget = pacing.budget(header.config, chosen)
            results = await self.collect(header, [self._task(header, t, algorithm, budget) for t in tasks],
                                         header.config.policy, failures)
            pacing.observe(header.config, chosen, results)
            return results

        started = time.monotonic()
        before = lane.edge_state  # algorithms return new dicts: this one stays as it is
        try:
            outcome = await run_edge_round(algorithm, global_, header.version, self.edge_id, before, train,
                                           offload=asyncio.to_thread)
            lane.edge_state = outcome.edge_state
            await asyncio.to_thread(self._save_state, header.run_id, lane.edge_state)  # encodes and fsyncs
            if self.settings.slowdown > 1:
                await asyncio.sleep((self.settings.slowdown - 1) * (time.monotonic() - started))
            await self.submit(header, outcome.aggregate.tensors, outcome.aggregate.weight, outcome.results,
                              failures)
            self.metrics.round_seconds.observe(time.monotonic() - started)
            log.debug("edge %d: version %d done with %d results", self.edge_id, header.version, len(outcome.results))
        except BaseException:
            # The re-run starts from the state this round started from, as after a restart (a failed save
            # leaves that on disk; after a save, the re-run replaces each client's entry with the same one).
            lane.edge_state = before
            raise

    def _task(self, header: GlobalStateHeader, task: ClientTask, algorithm: Algorithm,
              budget_s: float | None) -> Task:
        message = ClientTaskHeader(
            task_id=f"{header.run_id}-r{task.round}-e{self.edge_id}-c{task.client_id}", run_id=header.run_id,
            client_id=task.client_id, round=task.round, version=header.version, config=header.config,
            budget_s=budget_s,
        )
        lane = self.lanes.get(header.run_id)
        known = lane.num_samples if lane is not None else None
        return Task(message, task.tensors, partial(algorithm.check_result, task.tensors),
                    num_samples=known[task.client_id] if known else None,
                    max_samples=self.settings.max_client_samples)

    def _known_num_samples(self, header: GlobalStateHeader) -> list[int] | None:
        try:
            return known_num_samples(header.config)
        except Exception:  # e.g. an unreadable npz file: the cap (max_client_samples) bounds claims instead
            log.warning("edge %d: cannot derive the clients' sample counts of run %s; claims are capped by "
                        "max_client_samples=%s", self.edge_id, header.run_id, self.settings.max_client_samples,
                        exc_info=True)
            return None

    async def collect(self, header: GlobalStateHeader, tasks: list[Task], policy: RoundPolicy,
                      failures: list[ClientFailure]) -> list[ClientResult]:
        """Waits for answers; re-runs the round (same tasks) while fewer than the quorum answered; after
        max_retries, goes on with any answer, waiting for a first one only while the cloud still wants it.
        A client's reported failure ends the wait for it; the failures left unanswered join `failures`.
        (A run that ends meanwhile cancels the whole round: see `_forget_ended`.)"""
        run_id = header.run_id
        quorum = max(1, math.ceil(policy.min_fraction * len(tasks)))
        await self.board.post(tasks)
        log.info("edge %d: posted %d tasks of run %s, version %d", self.edge_id, len(tasks), run_id, header.version)
        try:
            for attempt in range(policy.max_retries + 1):
                results = await self.board.wait_results(run_id, policy.deadline_s)
                if len(results) >= quorum:
                    return results
                log.warning("edge %d: %d/%d answered (quorum %d); re-running the round (attempt %d)",
                            self.edge_id, len(results), len(tasks), quorum, attempt + 1)
            while not results:
                # No client can answer (e.g. every one fails on a diverged model): without this check the
                # edge would wait here for good, even after its run moved on to a newer version.
                if await self._moved_on(header):
                    raise RoundAbandoned(f"run {run_id} moved on from version {header.version}")
                # Every client may have reported failure: wait the deadline for a result all the same.
                results = await self.board.wait_results(run_id, policy.deadline_s, failures_settle=False)
            log.warning("edge %d: proceeding below quorum with %d results", self.edge_id, len(results))
            return results
        finally:
            failures.extend(self.board.failures(run_id))
            await self.board.clear(run_id)

    async def _moved_on(self, header: GlobalStateHeader) -> bool:
        """Whether the cloud now has a newer version of this run for this edge."""
        response = await self._poll(0, run=(header.run_id, header.version))
        return response.status_code == 200

    async def submit(self, header: GlobalStateHeader, tensors: Record, weight: float,
                     results: list[ClientResult], failures: list[ClientFailure]) -> None:
        message = EdgeContributionHeader(
            run_id=header.run_id,
            edge_id=self.edge_id,
            base_version=header.version,
            # Deterministic, so a retry after a lost answer (or an edge restart) is counted once.
            idempotency_key=f"{header.run_id}:{self.edge_id}:{header.version}",
            weight=weight,
            clients=participation(results),
            failures=failures,
        )
        blob = await asyncio.to_thread(encode, tensors, message)
        # Re-sent through a passing fault: the cloud counts an idempotency key once.
        response = await self.cloud.post(f"/api/v1/edges/{self.edge_id}/contributions", **binary_body(blob),
                                         extensions=DEDUPLICATED)
        self.metrics.submissions.labels(str(response.status_code)).inc()
        if response.status_code == 409:  # counted already, or the run moved on: nothing to do
            log.info("edge %d: %s", self.edge_id, response.text[:300])
        elif response.status_code >= 400:
            # The same contribution would be refused again (too large, values beyond the bounds): the run
            # cannot use this round. Said loudly: a synchronous run waits for this edge.
            log.error("edge %d: cloud refused the contribution of version %d: %s %s", self.edge_id,
                      header.version, response.status_code, response.text[:300])
