"""A client process's task feed: one long-poll for all its logical clients, whatever their number.

Each logical client holding its own long-poll cost the process a connection per client, and with 1,000 of
them httpx's connection pool scanned 1,000 busy connections on every request; the edge woke 1,000 waiters
per round. Here the process registers each client, then asks the edge for every open task of all of them
at once (`POST /api/v1/clients/tasks`), naming the tasks it already holds so that they do not come back;
the answer (a task bundle) hands each task to `deliver`. A client the edge no longer knows (it restarted)
is registered again; a client the edge refuses (401/403) is stopped for good.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import httpx

from fl_services.client.config import ClientSettings
from fl_services.client.state import drop_ended_runs
from fl_services.shared.core.data.summary import DataSummary
from fl_services.shared.wire import bundle
from fl_services.shared.wire.backoff import Backoff
from fl_services.shared.wire.bundle import BundleItem
from fl_services.shared.wire.client_edge import ClientRegistration, TaskPoll
from fl_services.shared.wire.protocol import REFUSED_CLIENTS, UNKNOWN_CLIENTS, live_runs
from fl_services.shared.wire.retry import DEDUPLICATED

log = logging.getLogger(__name__)


class ClientStopped(Exception):
    """A failure that retrying cannot heal (the edge refuses this client's token): ends that logical client."""


class ClientsStopped(RuntimeError):
    """Every logical client of the process stopped for good: what `Worker.run` raises (exit code 1 in main)."""


class Unregistered(Exception):
    """The edge does not know this client (404: it restarted and lost its registrations)."""


def check(response: httpx.Response, *, unknown_client: bool = True) -> None:
    """Raises ClientStopped for a refused token, Unregistered for 404, HTTPStatusError for other errors."""
    if response.status_code in (401, 403):
        raise ClientStopped(f"the edge refuses this client's token (HTTP {response.status_code}: "
                            f"{response.text[:200]}); check FL_CLIENT_CLIENT_TOKEN or its entry in "
                            "FL_CLIENT_CLIENT_TOKENS")
    if response.status_code == 404 and unknown_client:
        raise Unregistered()
    response.raise_for_status()


Deliver = Callable[[BundleItem], None]
REGISTRATIONS_AT_ONCE = 8
JOIN_SETTLE_S = 0.2


class TaskFeed:
    """Registers the process's logical clients and long-polls the edge for all their tasks at once."""

    def __init__(self, settings: ClientSettings, edge: httpx.AsyncClient, client_ids: list[int], deliver: Deliver,
                 summary: DataSummary | None = None):
        self.settings = settings
        self.summary = summary  # the device's own data, as it describes it in its registration
        self.edge = edge
        self.client_ids = client_ids
        self.deliver = deliver
        self.registered: set[int] = set()
        # Task ids received and not to be received again: in progress (until answered) or given up on.
        self.holding: set[str] = set()
        # Held task ids the edge posted again meanwhile (a failed round run again with the same ids): once one is
        # released, the poll in flight, which names it held, is asked again, or the task would wait a long-poll.
        self._posted_again: set[str] = set()
        # Logical clients ended for good, with the reason.
        self.stopped: dict[int, str] = {}
        self._registering: dict[int, asyncio.Task[None]] = {}
        self._live: set[str] | None = None  # the runs the edge last named live
        self._ends: dict[str, asyncio.Event] = {}  # set when the edge no longer names the run live
        self._ask_again = asyncio.Event()  # a client was registered (or a task released): the poll in flight is stale
        # A few registrations at a time: 1,000 at once held the edge's loop for seconds (its /health with it).
        self._registrations = asyncio.Semaphore(REGISTRATIONS_AT_ONCE)
        # Each logical client speaks with its own token (client_tokens) where it has one: a revoked one ends
        # that client alone.
        self.auth = {k: {"Authorization": f"Bearer {settings.token_of(k)}"} for k in client_ids}

    def run_end(self, run_id: str) -> asyncio.Event:
        """Set once the edge names `run_id` no longer live, or already set if it does now (a run whose task
        this process holds was live when the task arrived: the same answer named it)."""
        if self._live is not None and run_id not in self._live:
            ended = asyncio.Event()
            ended.set()
            return ended
        return self._ends.setdefault(run_id, asyncio.Event())

    async def run(self) -> None:
        """Serves until cancelled; raises ClientsStopped once every logical client has stopped for good."""
        try:
            for k in self.client_ids:
                self.unregistered(k)
            await self._poll_forever()
        finally:
            for task in self._registering.values():
                task.cancel()

    def unregistered(self, client_id: int) -> None:
        """The edge does not know the client (any more): it is registered again, and polled once it is."""
        self.registered.discard(client_id)
        if client_id not in self.stopped and client_id not in self._registering:
            self._registering[client_id] = asyncio.create_task(self._register(client_id))

    def release(self, task_id: str) -> None:
        """The task is answered (or given up for this attempt): it may come again."""
        self.holding.discard(task_id)
        if task_id in self._posted_again:
            self._posted_again.discard(task_id)
            self._ask_again.set()

    def stop(self, client_id: int, reason: str) -> None:
        log.error("client %d: stopped for good: %s", client_id, reason)
        self.stopped[client_id] = reason
        self.registered.discard(client_id)
        self._ask_again.set()  # the poll in flight may be for stopped clients only

    async def _register(self, client_id: int) -> None:
        backoff = Backoff(self.settings.retry_initial_s, self.settings.retry_max_s, jitter=0.5)
        reg = ClientRegistration(client_id=client_id, capabilities={"torch_threads": self.settings.torch_threads},
                                 labels=self.settings.label_map, summary=self.summary)
        try:
            while True:
                try:
                    async with self._registrations:
                        # Re-sent through a passing fault: a registration repeated replaces itself.
                        # Without the fields left unset: an edge that predates them still takes the registration.
                        response = await self.edge.post("/api/v1/clients",
                                                        json=reg.model_dump(mode="json", exclude_defaults=True),
                                                        headers=self.auth[client_id], extensions=DEDUPLICATED)
                    check(response, unknown_client=False)  # a 404 here is a wrong edge URL, not a lost registration
                    break
                except ClientStopped as exc:
                    self.stop(client_id, str(exc))
                    return
                except Exception as exc:  # never CancelledError: a stop still ends every client
                    delay = backoff.next()
                    log.error("client %d: registration failed: %s: %s; retrying in %.3gs", client_id,
                              type(exc).__name__, exc, delay)
                    await asyncio.sleep(delay)
            self.registered.add(client_id)
            self._ask_again.set()
        finally:
            del self._registering[client_id]

    async def _poll_forever(self) -> None:
        backoff = Backoff(self.settings.retry_initial_s, self.settings.retry_max_s, jitter=0.5)
        while True:
            if len(self.stopped) == len(self.client_ids):
                reasons = "; ".join(f"client {k}: {why}" for k, why in sorted(self.stopped.items()))
                raise ClientsStopped(f"every logical client of this process stopped for good ({reasons})")
            self._ask_again.clear()
            if not self.registered:
                await self._ask_again.wait()
                continue
            polled = sorted(self.registered)
            poll = asyncio.create_task(self._poll(polled))
            asked = asyncio.create_task(self._ask_again.wait())
            try:
                await asyncio.wait({poll, asked}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                asked.cancel()
            if not poll.done():  # a client joined or stopped, or a task came free: ask again as things are now
                poll.cancel()
                await asyncio.gather(poll, return_exceptions=True)
                if self._registering:  # more are joining (a start): one new poll for a batch of them
                    await asyncio.sleep(JOIN_SETTLE_S)
                continue
            try:
                self._received(polled, poll.result())
                backoff.reset()
            except Exception as exc:  # never CancelledError
                delay = backoff.next()
                log.error("polling the edge for tasks failed: %s: %s; retrying in %.3gs", type(exc).__name__,
                          exc, delay, exc_info=backoff.failures == 1)
                await asyncio.sleep(delay)

    async def _poll(self, client_ids: list[int]) -> httpx.Response:
        own = self.settings.client_tokens
        poll = TaskPoll(client_ids=client_ids, holding=sorted(self.holding), timeout=self.settings.long_poll_s,
                        tokens={k: own[k] for k in client_ids if k in own})
        # A read: re-sent through a passing fault, it brings the same tasks.
        return await self.edge.post("/api/v1/clients/tasks", content=poll.model_dump_json(),
                                    headers={"Content-Type": "application/json", **self.auth[client_ids[0]]},
                                    extensions=DEDUPLICATED)

    def _received(self, polled: list[int], response: httpx.Response) -> None:
        try:
            check(response, unknown_client=False)
        except ClientStopped as exc:  # the secret (or the one client's token) is refused: for every client asked
            for k in polled:
                self.stop(k, str(exc))
            return
        for k in filter(None, response.headers.get(REFUSED_CLIENTS, "").split(",")):
            if int(k) in self.registered:
                self.stop(int(k), f"the edge refuses client {k}'s token (invalid or revoked); check "
                                  "FL_CLIENT_CLIENT_TOKEN or its entry in FL_CLIENT_CLIENT_TOKENS")
        for k in filter(None, response.headers.get(UNKNOWN_CLIENTS, "").split(",")):
            if int(k) in self.registered:
                log.warning("client %s: unknown to the edge (restarted?); registering again", k)
                self.unregistered(int(k))
        live = live_runs(response.headers)  # named only once the edge heard it from the cloud
        if live is not None and live != self._live:
            self._live = live
            drop_ended_runs(self.settings.state_dir, live, self.client_ids)
            for run_id in [r for r in self._ends if r not in live]:
                self._ends.pop(run_id).set()
        if response.status_code == 204:
            return
        items = bundle.unpack(response.content)
        log.info("received %d tasks", len(items))  # with its time: bench/scale.py's wake-up latency
        for item in items:
            if item.client_id not in self.registered:
                continue
            if item.task_id in self.holding:
                self._posted_again.add(item.task_id)
            else:
                self.holding.add(item.task_id)
                self.deliver(item)
