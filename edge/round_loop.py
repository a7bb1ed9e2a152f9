"""The edge loop, written once: fetch global → select → dispatch → collect → edge_aggregate → submit.

It runs as a background task of the edge app and only ever dials out to the cloud.
"""
from __future__ import annotations

import asyncio
import logging
import math
import os
import time
from collections.abc import Awaitable
from functools import partial
from pathlib import Path

import httpx

from edge.config import EdgeSettings
from edge.metrics import EdgeMetrics
from edge.tasks import ForeignClient, Task, TaskBoard
from shared.algorithms import registry
from shared.algorithms.base import Algorithm, ClientResult
from shared.backoff import Backoff
from shared.config import RoundPolicy
from shared.edge_round import ClientTask, run_edge_round
from shared.federation import known_num_samples, participation
from shared.files import atomic_write
from shared.log import bind
from shared.schemas import (
    ClientFailure,
    ClientTaskHeader,
    EdgeContributionHeader,
    EdgeRegistration,
    GlobalStateHeader,
    RunEnd,
)
from shared.transport.http import binary_body
from shared.transport.records import Record, decode, decode_state, encode
from shared.transport.retry import DEDUPLICATED
from shared.transport.tensors import PayloadError

log = logging.getLogger(__name__)


class RoundAbandoned(Exception):
    """The cloud moved on while the round waited for clients that cannot answer."""


class EdgeRoundLoop:
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
        self.current: GlobalStateHeader | None = None
        self._algorithm: tuple[str, Algorithm] | None = None
        self._edge_state: Record = {}
        # The run whose clients' sample counts these are (None: the edge cannot know them).
        self._num_samples: tuple[str, list[int] | None] | None = None

    async def run_forever(self) -> None:
        await self.register()
        # The last state whose round succeeded: the long-poll asks for a newer one. It moves only after a
        # successful round, so after a failure the same state (or a newer one, if the cloud moved on) is
        # fetched again and its round re-run, instead of the edge waiting for a version that never comes.
        run_id, version = None, -1
        backoff = Backoff(self.retry_backoff_s, self.retry_backoff_max_s)
        while True:
            header: GlobalStateHeader | None = None
            try:
                response = await self._poll(run_id, version, self.settings.long_poll_max_s)
                if response.status_code == 204:
                    continue
                if response.status_code == 404:  # the cloud lost our registration (fresh Redis)
                    await self.register()
                    continue
                response.raise_for_status()
                # Unpacked into a new name: mypy does not narrow `header` through an awaited tuple.
                global_, received = await asyncio.to_thread(decode, response.content, GlobalStateHeader)
                header = received
                await self.until_run_ends(header, self.run_round(header, global_))
            except asyncio.CancelledError:
                raise
            except RoundAbandoned as exc:
                log.warning("edge %d: round abandoned: %s", self.edge_id, exc)
                continue  # the poll now answers with what the cloud moved on to
            except Exception:
                delay = backoff.next()
                if header is None:
                    log.exception("edge %d: fetching the state after version %d failed; retrying in %g s",
                                  self.edge_id, version, delay)
                else:
                    log.exception("edge %d: round at version %d of run %s failed; re-running it in %g s",
                                  self.edge_id, header.version, header.run_id, delay)
                await asyncio.sleep(delay)
                continue
            run_id, version = header.run_id, header.version
            backoff.reset()

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

    async def _poll(self, run_id: str | None, after: int, timeout: float) -> httpx.Response:
        """The cloud's long-poll: 200 with a global state newer than `after` of `run_id` (or of another
        run, once the cloud has moved on), 204 if none comes within `timeout`."""
        params: dict[str, str | int | float] = {"after": after, "timeout": timeout}
        if run_id:
            params["run_id"] = run_id
        return await self.cloud.get(f"/api/v1/edges/{self.edge_id}/global", params=params)

    async def register(self) -> None:
        reg = EdgeRegistration(edge_id=self.edge_id, url=self.settings.public_url)
        # Re-sent through a passing fault: a registration repeated replaces itself.
        response = await self.cloud.post("/api/v1/edges", json=reg.model_dump(), extensions=DEDUPLICATED)
        response.raise_for_status()
        log.info("edge %d registered with the cloud", self.edge_id)

    def check_own_client(self, client_id: int) -> None:
        """Raises ForeignClient for a client this edge does not serve in the run it knows (none yet: any)."""
        current = self.current
        if current is None:
            return
        config = current.config
        if client_id not in config.clients_of_edge(self.edge_id):
            raise ForeignClient(
                f"client {client_id} is not a client of edge {self.edge_id} in run {current.run_id}: edge "
                f"{self.edge_id} serves the clients k < {config.data.num_clients} with "
                f"k mod {config.topology.num_edges} = {self.edge_id}"
            )

    def algorithm(self, header: GlobalStateHeader) -> Algorithm:
        if self._algorithm is None or self._algorithm[0] != header.run_id:
            state = self._load_state(header.run_id)
            self._algorithm = (header.run_id, registry.create(header.config))
            self._edge_state = state
        return self._algorithm[1]

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

    def _save_state(self, run_id: str) -> None:
        """Atomically, so a crash leaves the previous state or this one. Saved before the submit: an
        edge that restarts re-runs the round, its clients answer from their saved results, and the
        incremental aggregation replaces each client's prototype, so nothing is counted twice."""
        path = self._state_path(run_id)
        if path is None:
            return
        atomic_write(path, encode(self._edge_state))

    async def run_round(self, header: GlobalStateHeader, global_: Record) -> None:
        self.current = header
        bind(run_id=header.run_id)
        # Before any run was known, any client id could register; now the run says which are this edge's.
        self.board.keep_only(set(header.config.clients_of_edge(self.edge_id)))
        algorithm = self.algorithm(header)
        if self._num_samples is None or self._num_samples[0] != header.run_id:
            self._num_samples = (header.run_id, await asyncio.to_thread(self._known_num_samples, header))
        failures: list[ClientFailure] = []  # of every edge round

        async def train(tasks: list[ClientTask]) -> list[ClientResult]:
            return await self.collect(header, [self._task(header, t, algorithm) for t in tasks], header.config.policy,
                                      failures)

        started = time.monotonic()
        before = self._edge_state  # algorithms return new dicts: this one stays as it is
        try:
            outcome = await run_edge_round(algorithm, global_, header.version, self.edge_id, before, train,
                                           offload=asyncio.to_thread)
            self._edge_state = outcome.edge_state
            await asyncio.to_thread(self._save_state, header.run_id)  # encodes and fsyncs
            if self.settings.slowdown > 1:
                await asyncio.sleep((self.settings.slowdown - 1) * (time.monotonic() - started))
            await self.submit(header, outcome.aggregate.tensors, outcome.aggregate.weight, outcome.results,
                              failures)
            self.metrics.round_seconds.observe(time.monotonic() - started)
            log.debug("edge %d: version %d done with %d results", self.edge_id, header.version, len(outcome.results))
        except BaseException:
            # The re-run starts from the state this round started from, as after a restart (a failed save
            # leaves that on disk; after a save, the re-run replaces each client's entry with the same one).
            self._edge_state = before
            raise

    def _task(self, header: GlobalStateHeader, task: ClientTask, algorithm: Algorithm) -> Task:
        message = ClientTaskHeader(
            task_id=f"{header.run_id}-r{task.round}-e{self.edge_id}-c{task.client_id}", run_id=header.run_id,
            client_id=task.client_id, round=task.round, version=header.version, config=header.config,
        )
        known = self._num_samples[1] if self._num_samples else None
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
        A client's reported failure ends the wait for it; the failures left unanswered join `failures`."""
        quorum = max(1, math.ceil(policy.min_fraction * len(tasks)))
        await self.board.post(tasks)
        try:
            for attempt in range(policy.max_retries + 1):
                results = await self.board.wait_results(policy.deadline_s)
                if len(results) >= quorum:
                    return results
                # A stopped run's missing clients are not worth another deadline: the next run waits.
                if await self._moved_on(header, to_another_run=True):
                    raise RoundAbandoned(f"run {header.run_id} was replaced while version {header.version} "
                                         "waited for its quorum")
                log.warning("edge %d: %d/%d answered (quorum %d); re-running the round (attempt %d)",
                            self.edge_id, len(results), len(tasks), quorum, attempt + 1)
            while not results:
                # No client can answer (e.g. every one fails on a diverged model): without this check the
                # edge would wait here for good, even after its run was stopped and another one started.
                if await self._moved_on(header):
                    raise RoundAbandoned(f"run {header.run_id} moved on from version {header.version}")
                # Every client may have reported failure: wait the deadline for a result all the same.
                results = await self.board.wait_results(policy.deadline_s, failures_settle=False)
            log.warning("edge %d: proceeding below quorum with %d results", self.edge_id, len(results))
            return results
        finally:
            failures.extend(self.board.failures())
            await self.board.clear()

    async def _moved_on(self, header: GlobalStateHeader, to_another_run: bool = False) -> bool:
        """Whether the cloud now offers this edge something newer: another run, or (unless only another
        run counts) a newer version of this one. A round short of its quorum is worth finishing on an
        older version of an asynchronous run: its late clients may still answer."""
        response = await self._poll(header.run_id, header.version, timeout=0)
        if response.status_code != 200:
            return False
        if not to_another_run:
            return True
        _, offered = await asyncio.to_thread(decode, response.content, GlobalStateHeader)
        return offered.run_id != header.run_id

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
