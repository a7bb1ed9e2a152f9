"""The edge loop, written once: fetch global → select → dispatch → collect → edge_aggregate → submit.

It runs as a background task of the edge app and only ever dials out to the cloud; every run that
includes this edge has its own rounds (a `Lane`), fed by one long-poll.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable
from functools import partial

import httpx

from fl_services.edge.config import EdgeSettings
from fl_services.edge.dispatch import Dispatch, MembersElsewhere, RoundAbandoned
from fl_services.edge.lanes import Lane, StateFiles
from fl_services.edge.membership import members
from fl_services.edge.metrics import EdgeMetrics
from fl_services.edge.pacing import EdgePacing
from fl_services.edge.revocations import Revocations
from fl_services.edge.secagg import SecureRound, collect_secure, round_name, site_key, site_public_key
from fl_services.edge.services import devices
from fl_services.edge.tasks import ForeignClient, TaskBoard
from fl_services.shared.core import late
from fl_services.shared.core.algorithms import registry
from fl_services.shared.core.algorithms.base import ClientResult
from fl_services.shared.core.data.summary import RunTask
from fl_services.shared.core.edge_round import ClientTask, SecureSum, run_edge_round
from fl_services.shared.core.federation import known_num_samples, run_task
from fl_services.shared.core.records import Record, decode
from fl_services.shared.core.reports import ClientFailure
from fl_services.shared.core.secagg import sites
from fl_services.shared.runtime.log import bind
from fl_services.shared.wire.backoff import Backoff
from fl_services.shared.wire.edge_cloud import EdgeRegistration, GlobalStateHeader, RunEnd
from fl_services.shared.wire.protocol import live_runs
from fl_services.shared.wire.retry import DEDUPLICATED

log = logging.getLogger(__name__)


class NoMembers(Exception):
    """A run over registered devices has none at this edge that it takes (yet)."""


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
        self.failed_round: tuple[str, int] | None = None  # (run_id, version) of the last round every device failed
        self.registered = False  # said once in the log; the site reports after it are the same call, quietly
        self.lanes: dict[str, Lane] = {}
        self.secure_rounds: dict[str, SecureRound] = {}  # by run: the round whose protocol is under way
        self._lanes_changed = asyncio.Event()
        self._live: set[str] | None = None  # the live runs the last long-poll answer named
        self.states = StateFiles(self.edge_id, settings.state_dir)
        self.site_key = site_key(self.edge_id, settings.state_dir)  # secure aggregation between sites
        self.dispatch = Dispatch(self.edge_id, board, cloud, settings.max_client_samples, self.metrics.submissions)
        self.revocations = Revocations()  # a device whose token is revoked is no run's member

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
            self.registered = False
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

    def version(self) -> int:
        """The version of the last round started, of any run (-1: none)."""
        return self.current.version if self.current else -1

    @property
    def serving(self) -> GlobalStateHeader | None:
        """The last round started, while the edge still serves its run: a run dropped because the state
        long-poll no longer names it live is not reported as served until the next one starts."""
        current = self.current
        return current if current is not None and current.run_id in self.lanes else None

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
            # Its devices are no longer training it: the run's sites page says so now, not at the next report.
            self.board.site_changed.set()
        if live != self._live:
            self._live = live
            self.states.keep_only(live)

    async def _serve(self, lane: Lane, header: GlobalStateHeader, global_: Record) -> None:
        """One run's round; a failed one is re-run after a backoff (from the same state, or a newer one)."""
        try:
            await self.until_run_ends(header, self.run_round(header, global_))
        except RoundAbandoned as exc:
            log.warning("edge %d: round abandoned: %s", self.edge_id, exc)
        except NoMembers as exc:  # devices may register meanwhile: the same round again after a backoff
            delay = lane.backoff.next()
            log.warning("edge %d: %s; trying again in %g s", self.edge_id, exc, delay)
            await asyncio.sleep(delay)
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

    def site_report(self) -> EdgeRegistration:
        """This edge as a site: its name, labels and URL, what it serves now, and its devices (each run's round
        tallied: whether every device failed it)."""
        serving = self.serving
        states, page, runs, label_sets = devices.site_devices(board=self.board,
                                                  memberships={run_id: lane.membership for run_id, lane
                                                               in self.lanes.items() if lane.membership is not None})
        return EdgeRegistration(edge_id=self.edge_id, url=self.settings.public_url, name=self.settings.name,
                                labels=self.settings.label_map, devices=len(self.board.clients),
                                serving=f"{serving.run_id}:{serving.version}" if serving else None,
                                report_s=self.settings.site_report_s, states=states, device_page=page, runs=runs,
                                label_sets=label_sets, mask_key=site_public_key(self.site_key))

    async def _all_failed(self, header: GlobalStateHeader, failures: list[ClientFailure]) -> None:
        """Every device of the round failed: the cloud hears it at once (a site report, whose tally of the run
        says so), not at the next periodic one."""
        round_ = (header.run_id, header.version)
        if round_ == self.failed_round:
            return
        self.failed_round = round_
        log.error("edge %d: every device failed version %d of run %s: %s", self.edge_id, header.version,
                  header.run_id, "; ".join(f"client {f.client_id} ({f.kind}): {f.error}" for f in failures[:3]))
        try:
            await self.register()
        except (httpx.HTTPError, OSError) as exc:  # the periodic report says it again
            log.debug("edge %d: site report failed: %s", self.edge_id, exc)

    async def register(self) -> None:
        # Re-sent through a passing fault: a registration repeated replaces itself.
        report = self.site_report().model_dump(mode="json", exclude_none=True)
        response = await self.cloud.post("/api/v1/edges", json=report, extensions=DEDUPLICATED)
        response.raise_for_status()
        log.log(logging.DEBUG if self.registered else logging.INFO, "edge %d registered with the cloud", self.edge_id)
        self.registered = True

    def report_batch_s(self) -> float:
        """How soon the cloud hears that a device registered, came back or went offline, or a run ended: a tenth of
        site_report_s, a second at most (a run waiting for devices is admitted then, not at the next periodic
        report), in one report however many change meanwhile."""
        return min(self.settings.site_report_s / 10, 1.0)

    async def report_forever(self) -> None:
        """Registers again every site_report_s, counted from the start of the last report (the cloud calls the
        site offline after three intervals, so the time a report takes must not stretch them), and soon after a
        device registers, comes back or goes offline, or a run ends here (board.site_changed): the cloud's site
        registry shows when the edge was last seen, its devices and its last round. A failed report waits for the
        next one (the state poll retries by itself)."""
        interval, changed = self.settings.site_report_s, self.board.site_changed
        clock = asyncio.get_running_loop()
        due = clock.time() + interval
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), max(0.0, due - clock.time()))
                await asyncio.sleep(self.report_batch_s())  # the rest of a burst of changes joins this report
            changed.clear()
            due = clock.time() + interval
            try:
                await self.register()
            except (httpx.HTTPError, OSError) as exc:
                log.debug("edge %d: site report failed: %s", self.edge_id, exc)

    def _own_clients(self) -> set[int] | None:
        """The clients of the simulated runs' rosters here; None (any device) while a run over registered devices
        is live, or none is known."""
        if not self.lanes or any(lane.config.selection is not None for lane in self.lanes.values()):
            return None
        return {k for lane in self.lanes.values() for k in members(lane.config, self.edge_id, {}, None, None).ids}

    def check_own_client(self, client_id: int) -> None:
        """Raises ForeignClient for a client this edge serves in none of the runs it knows (none yet, or a run
        over the devices registered here: any)."""
        own = self._own_clients()
        if own is None or client_id in own:
            return
        raise ForeignClient("; ".join(
            f"client {client_id} is not a client of edge {self.edge_id} in run {run_id}: edge {self.edge_id} "
            f"serves the clients k < {lane.config.data.num_clients} with k mod {lane.config.topology.num_edges} "
            f"= {self.edge_id}" for run_id, lane in self.lanes.items()))

    def lane(self, header: GlobalStateHeader) -> Lane:
        """The run's lane, made on its first state (its edge state read back from disk)."""
        lane = self.lanes.get(header.run_id)
        if lane is None:
            lane = Lane(header.config, registry.create(header.config), self.states.load(header.run_id),
                        Backoff(self.retry_backoff_s, self.retry_backoff_max_s),
                        EdgePacing(self.edge_id, header.run_id))
            self.lanes[header.run_id] = lane
        return lane

    async def run_round(self, header: GlobalStateHeader, global_: Record) -> None:
        self.current = header
        bind(run_id=header.run_id)
        lane = self.lane(header)
        # Before any run was known, any client id could register; now the simulated runs say which are this edge's.
        own = self._own_clients()
        if own is not None:
            self.board.keep_only(own)
        algorithm = lane.algorithm
        if not lane.samples_known:
            lane.num_samples, lane.trains = await asyncio.to_thread(self._known_data, header)
            lane.samples_known = True
        # The members as they are now: a device registering during the round is one from the next.
        membership = members(header.config, self.edge_id, self.board.devices(self.revocations.ids), lane.trains,
                             lane.num_samples, lane.elsewhere)
        if header.config.selection is not None:
            lane.membership = membership
        if not membership.ids:
            refused = "".join(f"; device {f.client_id} {f.error}" for f in membership.refused)
            raise NoMembers(f"run {header.run_id} has no member at edge {self.edge_id} yet: no registered device "
                            f"its selection takes{refused}")
        failures: list[ClientFailure] = list(membership.refused)  # of every edge round
        pacing = lane.pacing
        # policy.late = 'join': a device whose late answer is in no contribution yet gets no task (shared/core/late.py)
        join = header.config.policy.late == "join"
        busy = (self.board.late_clients(header.run_id, header.version)
                | {a.result.client_id for a in lane.joined}) if join else set()
        pacing.heard(header)

        async def train(tasks: list[ClientTask]) -> list[ClientResult] | SecureSum:
            chosen = [t.client_id for t in tasks]
            budget = pacing.budget(header.config, chosen)
            secure = (round_name(header.run_id, header.version, tasks[0].round, self.edge_id)
                      if header.config.secure_aggregation.edge and tasks else None)
            posted = [self.dispatch.task(header, t, algorithm, budget, membership.samples.get(t.client_id), secure)
                      for t in tasks]
            if secure is not None:
                summed = await collect_secure(self.board, self.secure_rounds, secure, posted, algorithm,
                                              header.config.policy, failures)
                pacing.observe(header.config, chosen, summed.results)
                return summed
            results = await self.dispatch.collect(header, posted, header.config.policy, failures,
                                                  partial(self._moved_on, header), partial(self._all_failed, header))
            pacing.observe(header.config, chosen, results)
            if join:  # the late answers that came by the time the round closed join its contribution
                answers, failed = await self.board.take_late(header.run_id, header.version)
                lane.joined.extend(answers)
                failures.extend(failed)
            return results

        started = time.monotonic()
        before = lane.edge_state  # algorithms return new dicts: this one stays as it is
        try:
            outcome = await run_edge_round(algorithm, global_, header.version, self.edge_id, before, train,
                                           offload=asyncio.to_thread, busy=busy,
                                           members=None if header.config.selection is None else membership.declared())
            lane.edge_state = outcome.edge_state
            await asyncio.to_thread(self.states.save, header.run_id, lane.edge_state)  # encodes and fsyncs
            if self.settings.slowdown > 1:
                await asyncio.sleep((self.settings.slowdown - 1) * (time.monotonic() - started))
            tensors = outcome.aggregate.tensors
            if header.config.secure_aggregation.cloud:  # the cloud sees only the sum over every site
                tensors = await asyncio.to_thread(sites.mask, header.config, header.run_id, header.version,
                                                  self.edge_id, self.site_key, tensors)
            parts = await late.aggregates(algorithm, lane.joined, self.edge_id, asyncio.to_thread)
            try:
                await self.dispatch.submit(header, tensors, outcome.aggregate.weight,
                                           outcome.results, failures, membership.declared(), parts)
            except MembersElsewhere as exc:  # re-run (below) without them: they train at the site that holds them
                lane.elsewhere.update(exc.holders)
                raise
            lane.joined = []  # sent: their devices take tasks again
            self.metrics.round_seconds.observe(time.monotonic() - started)
            log.debug("edge %d: version %d done with %d results", self.edge_id, header.version, len(outcome.results))
        except BaseException:
            # The re-run starts from the state this round started from, as after a restart (a failed save
            # leaves that on disk; after a save, the re-run replaces each client's entry with the same one).
            lane.edge_state = before
            raise

    def _known_data(self, header: GlobalStateHeader) -> tuple[list[int] | None, RunTask | None]:
        """A simulated run's sample counts, where the edge can derive them; a selected run's task, which its
        devices' data must fit (the devices' own summaries give their counts)."""
        try:
            if header.config.selection is not None:
                return None, run_task(header.config)
            return known_num_samples(header.config), None
        except Exception:  # e.g. an unreadable npz file: the cap (max_client_samples) bounds claims instead
            log.warning("edge %d: cannot derive the clients' sample counts (or the task) of run %s; claims are "
                        "capped by max_client_samples=%s", self.edge_id, header.run_id,
                        self.settings.max_client_samples, exc_info=True)
            return None, None

    async def _moved_on(self, header: GlobalStateHeader) -> bool:
        """Whether the cloud now has a newer version of this run for this edge."""
        response = await self._poll(0, run=(header.run_id, header.version))
        return response.status_code == 200
