"""The storage port's contract (cloud/storage/ports.py), run against every backend: each test is one promise the
routes and the orchestrator rely on. A new backend joins by adding itself to `backend`'s params
(docs/how-to-storage-backend.md)."""
from __future__ import annotations

import ast
import asyncio
import functools
import inspect
import math
import textwrap
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from fl_services.cloud.storage import (
    Conflict,
    LeaseLost,
    MembersElsewhere,
    MemoryStore,
    NotFound,
    StateTooLarge,
    Store,
    SubmitOutcome,
    now,
)
from fl_services.cloud.storage.blob_files import BlobFiles
from fl_services.cloud.storage.redis import Keys, RedisStore
from fl_services.cloud.storage.redis.connection import clients
from fl_services.shared.core.config import RunConfig
from fl_services.shared.core.reports import RoundRecord, RunStatus
from fl_services.shared.wire.admin import AuditRecord
from fl_services.shared.wire.edge_cloud import DeviceBrief, EdgeRegistration, SiteRun
from tests.cloud.harness import contribution_header

pytestmark = pytest.mark.anyio

# A backend: opens a fresh, empty store, whose stored values may hold `max_value_bytes` (None: its own limit).
Backend = Callable[[int | None], AbstractAsyncContextManager[Store]]


@asynccontextmanager
async def in_memory(max_value_bytes: int | None) -> AsyncIterator[Store]:
    yield MemoryStore(max_value_bytes)


@asynccontextmanager
async def in_redis(redis_url: str, blob_dir: Path | None, max_value_bytes: int | None) -> AsyncIterator[Store]:
    """`blob_dir`: the contributions' blobs in files there, not in Redis."""
    async with clients(redis_url, {}, max_connections=8, pool_timeout_s=5.0) as (client, bulk):
        prefix = f"test-{uuid.uuid4().hex}"  # a prefix of its own: empty
        files = None if blob_dir is None else BlobFiles(blob_dir, prefix, orphan_s=3600)
        if files is not None:
            files.prepare()
        store = RedisStore(client, Keys(prefix), bulk, blob_files=files)
        if max_value_bytes is not None:
            store.max_value_bytes = max_value_bytes
        yield store


@pytest.fixture(params=["memory", "redis", "redis+files"])
def backend(request: pytest.FixtureRequest) -> Backend:
    if request.param == "memory":
        return in_memory
    blob_dir = request.getfixturevalue("tmp_path") if request.param == "redis+files" else None
    return functools.partial(in_redis, request.getfixturevalue("redis_url"), blob_dir)


@pytest.fixture
async def store(backend: Backend) -> AsyncIterator[Store]:
    async with backend(None) as opened:
        yield opened


CONFIG = RunConfig(model={"name": "logreg"}, data={"dataset": "digits", "num_clients": 4}, rounds=3)
INITIAL = b"global state 0"
ACTIONS = {"created": [], "running": ["start"], "paused": ["start", "pause"], "stopped": ["stop"]}


async def new_run(store: Store, status: str = "running", run_id: str | None = None) -> str:
    run_id = run_id or store.new_run_id()
    await store.create_run(run_id, CONFIG, INITIAL)
    for action in ACTIONS[status]:
        await store.transition(run_id, action)  # type: ignore[arg-type]
    return run_id


def record(version: int, accuracy: float = 0.5) -> RoundRecord:
    at = now()
    return RoundRecord(round=version - 1, version=version, edges=[0], clients=[], contributions=[], train_loss=1.0,
                       test_loss=1.0, test_accuracy=accuracy, started_at=at, finished_at=at, elapsed_s=0.0)


async def commit(store: Store, run_id: str, version: int, *, count: int = 1, accuracy: float = 0.5,
                 finished: bool = False, **lease) -> bool:
    """The update of `version` consuming the first `count` buffered contributions."""
    consumed = await store.buffered(run_id, count)
    return await store.commit_update(run_id, version, consumed, b"global state %d" % (version + 1),
                                     b"cloud state %d" % (version + 1), record(version + 1, accuracy), finished,
                                     **lease)


async def submit(store: Store, run_id: str, edge_id: int = 0, base_version: int = 0, key: str | None = None,
                 synchronous: bool = True, members: tuple[int, ...] = ()) -> SubmitOutcome:
    header = contribution_header(run_id, edge_id=edge_id, base_version=base_version, key=key)
    return await store.submit(header, b"blob of edge %d on %d" % (edge_id, base_version), synchronous, members)


async def everything(store: Store, run_id: str) -> tuple:
    """All a run holds, as comparable values: what 'nothing changed' compares."""
    info = await store.info(run_id)
    return (info.model_dump_json(), await store.versioned_global(run_id), await store.cloud_state_blob(run_id),
            [r.model_dump_json() for r in await store.history(run_id)],
            [(c.entry_id, c.header, c.blob) for c in await store.buffered(run_id, 100)],
            [await store.has_pending(run_id, edge) for edge in range(4)])


async def test_the_backend_implements_every_method_of_the_port(store: Store) -> None:
    """A method the backend lacks would answer with the port's own body (None) at run time: mypy catches it only
    where the class is built by name."""
    port = {name for cls in Store.__mro__ if cls.__module__ == Store.__module__ for name, member in vars(cls).items()
            if inspect.iscoroutinefunction(member) and _declared_only(member)}
    assert len(port) > 30
    inherited = sorted(name for name in port if getattr(type(store), name) is getattr(Store, name))
    assert inherited == [], f"{type(store).__name__} does not implement {inherited}"


def _declared_only(method: Callable[..., object]) -> bool:
    """Whether the port's method has no body of its own (a docstring or `...`), unlike those it implements once
    for every backend over the others (`history`, `infos`)."""
    (function,) = ast.parse(textwrap.dedent(inspect.getsource(method))).body
    assert isinstance(function, ast.AsyncFunctionDef)
    return all(isinstance(line, ast.Expr) and isinstance(line.value, ast.Constant) for line in function.body)


# ---- runs ------------------------------------------------------------------------------------------
async def test_a_created_run_reads_back_whole(store: Store) -> None:
    before = now()
    first, second = store.new_run_id(), store.new_run_id()
    assert first != second and len(first) == 12 and int(first, 16) >= 0
    await new_run(store, "created", first)
    await new_run(store, "created", second)
    info = await store.info(first)
    assert (info.run_id, info.status, info.version, info.rounds, info.buffered) == (first, RunStatus.created, 0, 3, 0)
    assert info.config == CONFIG == await store.config(first)
    assert before - timedelta(seconds=1) <= info.created_at <= now() + timedelta(seconds=1)
    assert (info.started_at, info.finished_at, info.last_round) == (None, None, None)
    assert await store.status(first) == (RunStatus.created, 0)
    assert await store.global_blob(first) == INITIAL
    assert await store.versioned_global(first) == (0, INITIAL)
    assert await store.cloud_state_blob(first) is None
    assert await store.history(first) == []
    assert await store.run_ids() == [first, second]  # creation order
    assert await store.active_runs() == []


async def test_an_unknown_run_is_not_found(store: Store) -> None:
    kept = await new_run(store)
    for read in (store.config, store.status, store.info, store.global_blob, store.versioned_global, store.history,
                 store.delete_run):
        with pytest.raises(NotFound):
            await read("0123456789ab")
    with pytest.raises(NotFound):
        await store.history_since("0123456789ab", 0)
    with pytest.raises(NotFound):
        await store.transition("0123456789ab", "start")
    assert [info.run_id for info in await store.infos(["0123456789ab", kept])] == [kept]
    assert await store.fill_evaluation("0123456789ab", record(1)) is False
    assert await store.buffered("0123456789ab", 10) == [] and await store.buffered_headers("0123456789ab") == []
    assert await store.has_pending("0123456789ab", 0) is False


@pytest.mark.parametrize(("start", "action", "after"), [
    ("created", "start", RunStatus.running), ("running", "pause", RunStatus.paused),
    ("paused", "resume", RunStatus.running), ("created", "stop", RunStatus.stopped),
    ("running", "stop", RunStatus.stopped), ("paused", "stop", RunStatus.stopped),
])
async def test_a_control_action_moves_the_run(store: Store, start: str, action: str, after: RunStatus) -> None:
    run_id = await new_run(store, start)
    assert await store.transition(run_id, action) == after  # type: ignore[arg-type]
    info = await store.info(run_id)
    assert info.status == after
    assert (info.started_at is not None) == (start != "created" or action == "start")
    assert (info.finished_at is not None) == (after == RunStatus.stopped)
    assert (await store.active_runs() == [run_id]) == (after in (RunStatus.running, RunStatus.paused))


async def test_admission_stamps_started_at_again(store: Store) -> None:
    """A run over registered devices is timed from its admission once admitted (its start timeout bounds a run
    that cannot train), not from when it began to wait."""
    run_id = await new_run(store, "created")
    await store.transition(run_id, "wait")
    waited = (await store.info(run_id)).started_at
    await asyncio.sleep(0.01)
    assert await store.transition(run_id, "admit") == RunStatus.running
    admitted = (await store.info(run_id)).started_at
    assert waited is not None and admitted is not None and admitted > waited


async def test_a_waiting_run_says_what_it_waits_for_until_its_admission(store: Store) -> None:
    run_id = await new_run(store, "created")
    with pytest.raises(Conflict):  # only a waiting run waits for something
        await store.note_waiting(run_id, "waiting for 2 devices")
    await store.transition(run_id, "wait")
    await store.note_waiting(run_id, "waiting for 2 devices; 1 connected")
    assert (await store.info(run_id)).reason == "waiting for 2 devices; 1 connected"
    await store.transition(run_id, "admit")
    assert (await store.info(run_id)).reason is None
    with pytest.raises(Conflict):
        await store.note_waiting(run_id, "waiting for 2 devices")
    assert (await store.info(run_id)).reason is None


async def test_a_waiting_run_stopped_without_a_reason_no_longer_says_what_it_waited_for(store: Store) -> None:
    run_id = await new_run(store, "created")
    await store.transition(run_id, "wait")
    await store.note_waiting(run_id, "waiting for 2 devices; 1 connected")
    await store.transition(run_id, "stop")  # an operator's stop gives no reason
    info = await store.info(run_id)
    assert (info.status, info.reason) == (RunStatus.stopped, None)


@pytest.mark.parametrize(("start", "action"), [
    ("created", "pause"), ("created", "resume"), ("running", "start"), ("running", "resume"), ("paused", "pause"),
    ("paused", "start"), ("stopped", "start"), ("stopped", "resume"), ("stopped", "stop"),
])
async def test_a_control_action_the_status_forbids_is_a_conflict_that_changes_nothing(
        store: Store, start: str, action: str) -> None:
    run_id = await new_run(store, start)
    before = await everything(store, run_id)
    with pytest.raises(Conflict, match=f"cannot {action} a run that is {start}"):
        await store.transition(run_id, action)  # type: ignore[arg-type]
    assert await everything(store, run_id) == before


async def test_the_active_runs_are_the_running_and_paused_sorted_by_id(store: Store) -> None:
    for run_id, status in (("cc", "running"), ("aa", "paused"), ("bb", "created"), ("dd", "stopped"),
                           ("ab", "running")):
        await new_run(store, status, run_id)
    assert await store.active_runs() == ["aa", "ab", "cc"]
    assert await store.run_ids() == ["cc", "aa", "bb", "dd", "ab"]


@pytest.mark.parametrize("status", ["running", "paused"])
async def test_an_active_run_cannot_be_deleted(store: Store, status: str) -> None:
    run_id = await new_run(store, status)
    await submit(store, run_id)
    before = await everything(store, run_id)
    with pytest.raises(Conflict, match="stop it first"):
        await store.delete_run(run_id)
    assert await everything(store, run_id) == before


async def test_deleting_a_run_leaves_nothing_of_it_and_the_others_as_they_were(store: Store) -> None:
    other = await new_run(store)
    await submit(store, other)
    gone = await new_run(store)
    await submit(store, gone, edge_id=1)
    await store.transition(gone, "stop")
    assert await store.acquire_lease(gone, 30.0, "replica-1") is not None
    created = await new_run(store, "created")
    kept = await everything(store, other)
    await store.delete_run(gone)
    await store.delete_run(created)
    assert await store.run_ids() == [other]
    with pytest.raises(NotFound):
        await store.info(gone)
    assert await store.buffered(gone, 10) == [] and not await store.has_pending(gone, 1)
    assert await everything(store, other) == kept
    await store.create_run(gone, CONFIG, b"again")  # the id is free: nothing of the old run comes back
    assert (await store.info(gone)).buffered == 0 and await store.history(gone) == []
    assert await store.acquire_lease(gone, 30.0, "replica-2") is not None


async def test_the_ended_runs_are_listed_with_when_they_ended_for_retention(store: Store) -> None:
    stopped = await new_run(store, "stopped")
    await new_run(store, "created")
    await new_run(store, "paused")
    finished = await new_run(store)
    await submit(store, finished)
    assert await commit(store, finished, 0, finished=True)
    ended = await store.ended_runs()
    assert [run_id for run_id, _ in ended] == [stopped, finished]
    for run_id, at in ended:
        assert at == (await store.info(run_id)).finished_at and at.tzinfo is not None


# ---- the contribution buffer -----------------------------------------------------------------------
async def test_an_accepted_contribution_is_buffered_with_its_blob(store: Store) -> None:
    run_id = await new_run(store)
    assert await submit(store, run_id, edge_id=1) == SubmitOutcome(True, False, 1)
    [entry] = await store.buffered(run_id, 10)
    assert entry.header == contribution_header(run_id, edge_id=1) and entry.blob == b"blob of edge 1 on 0"
    assert abs(entry.received_s - now().timestamp()) < 5
    assert (await store.info(run_id)).buffered == 1
    assert await store.has_pending(run_id, 1) and not await store.has_pending(run_id, 0)


async def test_a_retried_submission_is_a_duplicate_buffered_once_even_after_its_update(store: Store) -> None:
    run_id = await new_run(store)
    assert await submit(store, run_id, key="k") == SubmitOutcome(True, False, 1)
    assert await submit(store, run_id, key="k") == SubmitOutcome(True, True, 1)
    assert len(await store.buffered(run_id, 10)) == 1
    assert await commit(store, run_id, 0)
    assert await submit(store, run_id, key="k") == SubmitOutcome(True, True, 0)  # consumed: not buffered again
    assert await store.buffered(run_id, 10) == []
    await store.transition(run_id, "stop")
    assert (await submit(store, run_id, key="k")).duplicate  # answered as before, whatever the status now


async def test_the_buffer_keeps_acceptance_order(store: Store) -> None:
    run_id = await new_run(store)
    for edge_id in (2, 0, 3, 1):
        await submit(store, run_id, edge_id=edge_id)
    entries = await store.buffered(run_id, 10)
    assert [c.header.edge_id for c in entries] == [2, 0, 3, 1]
    assert [c.header.edge_id for c in await store.buffered(run_id, 2)] == [2, 0]
    assert len({c.entry_id for c in entries}) == 4
    received = [c.received_s for c in entries]
    assert received == sorted(received)
    headers = await store.buffered_headers(run_id)
    assert [(at.timestamp(), h) for at, h in headers] == [(c.received_s, c.header) for c in entries]
    assert all(at.tzinfo == timezone.utc for at, _ in headers)


async def on_version_1(store: Store) -> str:
    """A running run at version 1 whose edge 1 still waits in the buffer (its update consumed edge 0 only)."""
    run_id = await new_run(store)
    await submit(store, run_id, edge_id=0)
    await submit(store, run_id, edge_id=1)
    assert await commit(store, run_id, 0, count=1)
    return run_id


@pytest.mark.parametrize(("status", "edge_id", "base_version", "key", "reason", "message"), [
    ("stopped", 2, 1, None, "not_running", "run is stopped, not accepting contributions"),
    ("created", 0, 0, None, "not_running", "run is created, not accepting contributions"),
    ("running", 2, 2, None, "future", "base_version 2 is newer than the run's version 1"),
    ("running", 2, 0, None, "stale", "stale submission: base_version 0, current version 1"),
    ("running", 0, 1, "other", "conflict", "edge 0 already submitted for version 1 under another idempotency key"),
    ("running", 2, 1, "first", "key_reused", "idempotency key 'first' was used for another contribution"),
    ("running", 1, 1, None, "pending", "edge 1 already has a contribution waiting in the buffer"),
], ids=["stopped", "created", "future", "stale", "slot-taken", "key-reused", "pending"])
async def test_a_refused_submission_says_why_and_changes_nothing(
        store: Store, status: str, edge_id: int, base_version: int, key: str | None, reason: str, message: str) -> None:
    run_id = await on_version_1(store)  # edge 1 waits on version 0
    assert await submit(store, run_id, edge_id=0, base_version=1, key="first") == SubmitOutcome(True, False, 2)
    if status == "created":
        run_id = await new_run(store, "created")
    elif status == "stopped":
        await store.transition(run_id, "stop")
    before = await everything(store, run_id)
    with pytest.raises(Conflict, match=message) as refused:
        await submit(store, run_id, edge_id, base_version, key)
    assert refused.value.reason == reason
    assert await everything(store, run_id) == before


async def test_a_device_is_held_by_the_edge_that_declared_it_first_whatever_the_history(store: Store) -> None:
    """One site per device: a contribution declaring a device another edge's accepted one declared is refused,
    naming each such device and its edge, and changes nothing; after the updates that consumed them too."""
    run_id = await new_run(store)
    assert (await submit(store, run_id, edge_id=0, members=(7, 8))).accepted
    before = await everything(store, run_id)
    with pytest.raises(MembersElsewhere, match=r"devices \[7, 8\]") as refused:
        await submit(store, run_id, edge_id=1, members=(7, 8, 9))
    assert refused.value.holders == {7: 0, 8: 0} and refused.value.reason == "member_elsewhere"
    assert await everything(store, run_id) == before
    assert (await submit(store, run_id, edge_id=1, members=(9,))).accepted  # 9 is nobody's yet: edge 1's now
    assert await commit(store, run_id, 0, count=2)
    for version in (1, 2):  # consumed: the history holds them, the index still says whose they are
        with pytest.raises(MembersElsewhere) as refused:
            await submit(store, run_id, edge_id=0, base_version=version, members=(7, 9))
        assert refused.value.holders == {9: 1}
        assert (await submit(store, run_id, edge_id=0, base_version=version, members=(7, 8))).accepted
        assert (await submit(store, run_id, edge_id=1, base_version=version, members=(9,))).accepted
        assert await commit(store, run_id, version, count=2)
    other = await new_run(store)  # another run: its own index
    assert (await submit(store, other, edge_id=1, members=(7,))).accepted


async def test_a_deleted_run_leaves_no_device_held(store: Store) -> None:
    run_id = await new_run(store)
    assert (await submit(store, run_id, edge_id=0, members=(7,))).accepted
    await store.transition(run_id, "stop")
    await store.delete_run(run_id)
    await new_run(store, run_id=run_id)
    assert (await submit(store, run_id, edge_id=1, members=(7,))).accepted


async def test_an_unknown_run_refuses_a_contribution(store: Store) -> None:
    with pytest.raises(Conflict, match="run is missing") as refused:
        await submit(store, "0123456789ab")
    assert refused.value.reason == "not_running"


async def test_an_asynchronous_algorithm_takes_a_stale_contribution(store: Store) -> None:
    run_id = await on_version_1(store)
    assert await submit(store, run_id, edge_id=2, base_version=0, synchronous=False) == SubmitOutcome(True, False, 2)


async def test_a_paused_run_keeps_its_contributions_and_publishes_no_update_until_it_resumes(store: Store) -> None:
    """A pause holds the version from its answer on: an update computed before it commits nothing, and the
    contributions stay buffered (none lost) for the update after the resume."""
    run_id = await new_run(store, "paused")
    assert (await submit(store, run_id)).accepted
    before = await everything(store, run_id)
    assert await commit(store, run_id, 0) is False
    assert await everything(store, run_id) == before
    assert await store.status(run_id) == (RunStatus.paused, 0)
    await store.transition(run_id, "resume")
    assert await commit(store, run_id, 0)
    assert await store.status(run_id) == (RunStatus.running, 1)


async def test_a_commit_publishes_the_version_and_consumes_its_contributions_at_once(store: Store) -> None:
    run_id = await new_run(store)
    for edge_id in (0, 1, 2):
        await submit(store, run_id, edge_id=edge_id)
    assert await commit(store, run_id, 0, count=2)
    assert await store.versioned_global(run_id) == (1, b"global state 1")
    assert await store.global_blob(run_id) == b"global state 1"
    assert await store.cloud_state_blob(run_id) == b"cloud state 1"
    assert [r.version for r in await store.history(run_id)] == [1]
    info = await store.info(run_id)
    assert (info.status, info.version, info.buffered) == (RunStatus.running, 1, 1)
    assert info.last_round is not None and info.last_round.version == 1
    assert [c.header.edge_id for c in await store.buffered(run_id, 10)] == [2]
    assert [await store.has_pending(run_id, e) for e in (0, 1, 2)] == [False, False, True]
    assert (await submit(store, run_id, edge_id=0, base_version=1)).accepted  # its next round


async def test_the_last_update_finishes_the_run(store: Store) -> None:
    run_id = await new_run(store)
    await submit(store, run_id)
    assert await commit(store, run_id, 0, finished=True)
    info = await store.info(run_id)
    assert (info.status, info.version) == (RunStatus.finished, 1) and info.finished_at is not None
    assert await store.active_runs() == []
    with pytest.raises(Conflict, match="run is finished"):
        await submit(store, run_id, base_version=1)


@pytest.mark.parametrize("why", ["published-meanwhile", "stopped-meanwhile", "deleted-meanwhile"])
async def test_a_commit_on_a_run_that_moved_publishes_nothing(store: Store, why: str) -> None:
    run_id = await new_run(store)
    await submit(store, run_id)
    entries = await store.buffered(run_id, 1)
    if why == "published-meanwhile":
        assert await commit(store, run_id, 0)
    else:
        await store.transition(run_id, "stop")
    if why == "deleted-meanwhile":
        await store.delete_run(run_id)
        assert await store.commit_update(run_id, 0, entries, b"g", b"s", record(1), False) is False
        assert await store.run_ids() == []
        return
    before = await everything(store, run_id)
    assert await store.commit_update(run_id, 0, entries, b"g", b"s", record(1), False) is False
    assert await everything(store, run_id) == before


async def test_an_update_too_large_to_store_is_refused_and_changes_nothing(backend: Backend) -> None:
    async with backend(1000) as store:
        run_id = await new_run(store)
        await submit(store, run_id)
        entries = await store.buffered(run_id, 1)
        before = await everything(store, run_id)
        for new_global, new_state, what in ((b"g" * 1001, b"s", "global state"), (b"g", b"s" * 1001, "cloud state")):
            with pytest.raises(StateTooLarge, match=f"the new {what}"):
                await store.commit_update(run_id, 0, entries, new_global, new_state, record(1), False)
            assert await everything(store, run_id) == before
        assert await store.commit_update(run_id, 0, entries, b"g" * 1000, b"s" * 1000, record(1), False)


async def test_an_evaluation_is_filled_in_once_into_its_own_record(store: Store) -> None:
    run_id = await new_run(store)
    await submit(store, run_id)
    assert await commit(store, run_id, 0, accuracy=math.nan)
    assert math.isnan((await store.info(run_id)).last_round.test_accuracy)  # type: ignore[union-attr]
    assert await store.fill_evaluation(run_id, record(2, 0.9)) is False  # no record of round 1 yet
    wrong_version = record(1, 0.9).model_copy(update={"version": 5})
    assert await store.fill_evaluation(run_id, wrong_version) is False
    assert await store.fill_evaluation(run_id, record(1, 0.9)) is True
    assert [r.test_accuracy for r in await store.history(run_id)] == [0.9]
    assert await store.fill_evaluation(run_id, record(1, 0.1)) is False  # evaluated already
    assert [r.test_accuracy for r in await store.history(run_id)] == [0.9]


async def test_the_history_is_read_from_any_record_on(store: Store) -> None:
    run_id = await new_run(store)
    for version in range(3):
        await submit(store, run_id, edge_id=0, base_version=version)
        assert await commit(store, run_id, version)
    assert [r.version for r in await store.history(run_id)] == [1, 2, 3]
    assert [r.version for r in await store.history_since(run_id, 1)] == [2, 3]
    assert await store.history_since(run_id, 3) == []


# ---- the update lease, fencing the commit ----------------------------------------------------------
async def test_a_lease_is_held_by_one_holder_at_a_time(store: Store) -> None:
    held = await store.acquire_lease("run-a", 30.0, "replica-1")
    assert held is not None and held.run_id == "run-a"
    assert await store.acquire_lease("run-a", 30.0, "replica-2") is None
    other = await store.acquire_lease("run-b", 30.0, "replica-2")  # leases are per run
    assert other is not None and other.token != held.token
    await store.extend_lease(held)
    await store.release_lease(held)
    again = await store.acquire_lease("run-a", 30.0, "replica-2")
    assert again is not None and again.token != held.token
    with pytest.raises(LeaseLost):
        await store.release_lease(held)  # released already: it must not release the new holder's
    with pytest.raises(LeaseLost):
        await store.extend_lease(held)
    assert await store.acquire_lease("run-a", 30.0, "replica-3") is None  # the new holder still holds it


async def test_an_expired_lease_is_lost_and_another_may_take_it(store: Store) -> None:
    lease = await store.acquire_lease("run-a", 0.2, "replica-1")
    assert lease is not None
    await asyncio.sleep(0.1)
    await store.extend_lease(lease)  # another 0.2 s from now
    await asyncio.sleep(0.15)
    assert await store.acquire_lease("run-a", 30.0, "replica-2") is None, "the extension did not hold"
    await asyncio.sleep(0.2)
    with pytest.raises(LeaseLost):
        await store.extend_lease(lease)
    assert await store.acquire_lease("run-a", 30.0, "replica-2") is not None


async def test_a_stale_lease_cannot_commit_and_the_current_one_can(store: Store) -> None:
    run_id = await new_run(store)
    await submit(store, run_id)
    stale = await store.acquire_lease(run_id, 0.1, "replica-1")
    await asyncio.sleep(0.25)
    current = await store.acquire_lease(run_id, 30.0, "replica-2")
    assert stale is not None and current is not None
    before = await everything(store, run_id)
    assert await commit(store, run_id, 0, lease=stale) is False
    assert await everything(store, run_id) == before
    assert await commit(store, run_id, 0, lease=current) is True
    assert await store.status(run_id) == (RunStatus.running, 1)
    await store.release_lease(current)


async def test_a_released_lease_cannot_commit(store: Store) -> None:
    run_id = await new_run(store)
    await submit(store, run_id)
    lease = await store.acquire_lease(run_id, 30.0, "replica-1")
    assert lease is not None
    await store.release_lease(lease)
    assert await commit(store, run_id, 0, lease=lease) is False
    assert await store.status(run_id) == (RunStatus.running, 0)


# ---- edges, events, audit, revocations -------------------------------------------------------------
async def test_registered_edges_are_known(store: Store) -> None:
    assert await store.registered_edges() == set() and not await store.edge_known(0)
    await store.register_edge(EdgeRegistration(edge_id=3, url="http://edge-3"))
    await store.register_edge(EdgeRegistration(edge_id=0))
    await store.register_edge(EdgeRegistration(edge_id=3))  # again: still one edge 3
    assert await store.registered_edges() == {0, 3}
    assert await store.edge_known(3) and await store.edge_known(0) and not await store.edge_known(1)


async def test_every_listener_hears_every_message_published_once_subscribed(store: Store) -> None:
    heard: dict[str, list[str]] = {"a": [], "b": []}
    ready = {name: asyncio.Event() for name in heard}

    def listener(name: str) -> asyncio.Task[None]:
        async def subscribed() -> None:
            ready[name].set()

        async def hear(message: str) -> None:
            heard[name].append(message)

        return asyncio.create_task(store.listen(subscribed, hear))

    listeners = [listener(name) for name in heard]
    await asyncio.wait_for(asyncio.gather(*(e.wait() for e in ready.values())), 5)
    for message in ("replica-1", "replica-2", "replica-1"):
        await store.publish(message)
    async with asyncio.timeout(5):
        while any(len(h) < 3 for h in heard.values()):
            await asyncio.sleep(0.01)
    assert heard == {"a": ["replica-1", "replica-2", "replica-1"], "b": ["replica-1", "replica-2", "replica-1"]}
    listeners[0].cancel()
    await asyncio.gather(listeners[0], return_exceptions=True)
    await store.publish("after")  # a listener gone is no one's problem
    async with asyncio.timeout(5):
        while heard["b"][-1:] != ["after"]:
            await asyncio.sleep(0.01)
    assert heard["a"][-1] == "replica-1"
    listeners[1].cancel()
    await asyncio.gather(listeners[1], return_exceptions=True)


def audit_record(k: int) -> AuditRecord:
    return AuditRecord(at=datetime(2025, 1, 1, tzinfo=timezone.utc) + timedelta(seconds=k), actor="admin",
                       address="127.0.0.1", action="create", target=f"run-{k}", detail=None)


async def test_the_audit_log_reads_newest_first(store: Store) -> None:
    assert await store.audit_log(10) == []
    for k in range(5):
        await store.audit(audit_record(k), 100)
    assert await store.audit_log(3) == [audit_record(4), audit_record(3), audit_record(2)]
    assert len(await store.audit_log(100)) == 5


async def test_the_audit_log_is_capped_keeping_at_least_the_latest(store: Store) -> None:
    for k in range(350):
        await store.audit(audit_record(k), 10)
    kept = await store.audit_log(1000)
    # About max_entries, never fewer: Redis trims whole stream nodes (100 entries each).
    assert 10 <= len(kept) <= 10 + 100, len(kept)
    assert kept == [audit_record(k) for k in range(349, 349 - len(kept), -1)]


async def test_a_revocation_is_kept_once_with_its_first_time(store: Store) -> None:
    assert await store.revoked_tokens() == []
    first = await store.revoke_token("device-1")
    await asyncio.sleep(0.01)
    other = await store.revoke_token("device-2")
    again = await store.revoke_token("device-1")
    assert again == first and first.token_id == "device-1" and first.revoked_at < other.revoked_at
    assert await store.revoked_tokens() == [first, other]


async def test_migrating_an_empty_store_keeps_it_empty_and_working(store: Store) -> None:
    await store.ping()
    await store.migrate()
    await store.migrate()  # idempotent
    assert await store.run_ids() == [] and await store.active_runs() == []
    run_id = await new_run(store)
    assert await store.active_runs() == [run_id]


# ---- the site registry ---------------------------------------------------------------------------------------
async def test_a_site_is_kept_by_name_with_its_labels_and_reports(store: Store) -> None:
    first = await store.report_site(EdgeRegistration(edge_id=3, url="http://a:1", name="lyon",
                                                     labels={"region": "eu"}, devices=0))
    later = await store.report_site(EdgeRegistration(edge_id=3, url="http://a:1", name="lyon",
                                                     labels={"region": "eu"}, devices=5, serving="r1:4",
                                                     mask_key="A" * 43 + "="))
    await store.report_site(EdgeRegistration(edge_id=1))  # no name: edge-1
    sites = await store.sites()
    assert [s.name for s in sites] == ["edge-1", "lyon"]
    assert sites[1] == later and later.registered_at == first.registered_at and later.last_seen >= first.last_seen
    assert (later.edge_id, later.labels, later.url, later.devices, later.serving) == (3, {"region": "eu"},
                                                                                        "http://a:1", 5, "r1:4")
    assert later.mask_key == "A" * 43 + "="  # a site's public key for secure aggregation between sites


async def test_a_site_name_belongs_to_one_edge(store: Store) -> None:
    await store.report_site(EdgeRegistration(edge_id=0, name="lyon"))
    with pytest.raises(Conflict, match="edge 0's, not edge 1's"):
        await store.report_site(EdgeRegistration(edge_id=1, name="lyon"))
    assert [(s.name, s.edge_id) for s in await store.sites()] == [("lyon", 0)]


async def test_a_renamed_edge_leaves_its_old_name(store: Store) -> None:
    await store.report_site(EdgeRegistration(edge_id=0, name="lyon"))
    await store.report_site(EdgeRegistration(edge_id=0, name="paris", labels={"tier": "gold"}))
    assert [(s.name, s.labels) for s in await store.sites()] == [("paris", {"tier": "gold"})]


async def test_a_rename_drops_only_the_renamed_edges_former_name(store: Store) -> None:
    for edge_id, name in [(0, "lyon"), (1, "paris"), (2, "oslo")]:
        await store.report_site(EdgeRegistration(edge_id=edge_id, name=name))
    await store.report_site(EdgeRegistration(edge_id=1, name="rome"))
    await store.report_site(EdgeRegistration(edge_id=1, name="bern"))
    assert [(s.name, s.edge_id) for s in await store.sites()] == [("bern", 1), ("lyon", 0), ("oslo", 2)]


async def test_an_edge_whose_site_was_removed_renames_without_touching_the_name_another_edge_took(store: Store) -> None:
    await store.report_site(EdgeRegistration(edge_id=0, name="lyon"))
    await store.remove_site("lyon")
    await store.report_site(EdgeRegistration(edge_id=1, name="lyon"))  # free again: another edge takes it
    await store.report_site(EdgeRegistration(edge_id=0, name="paris"))
    assert [(s.name, s.edge_id) for s in await store.sites()] == [("lyon", 1), ("paris", 0)]
    await store.report_site(EdgeRegistration(edge_id=1, name="rome"))
    assert [(s.name, s.edge_id) for s in await store.sites()] == [("paris", 0), ("rome", 1)]


async def test_a_removed_site_is_gone_until_its_edge_reports_again(store: Store) -> None:
    await store.report_site(EdgeRegistration(edge_id=0, name="lyon"))
    await store.report_site(EdgeRegistration(edge_id=1, name="paris"))
    await store.remove_site("lyon")
    assert [s.name for s in await store.sites()] == ["paris"]
    with pytest.raises(NotFound, match="lyon"):
        await store.remove_site("lyon")
    again = await store.report_site(EdgeRegistration(edge_id=0, name="lyon"))
    assert [s.name for s in await store.sites()] == ["lyon", "paris"] and again.registered_at == again.last_seen


async def test_a_sites_devices_and_runs_are_as_its_last_report_says(store: Store) -> None:
    seen = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
    failed = DeviceBrief(client_id=7, state="failed", last_seen=seen, samples=120, family="cnn",
                         failure="DataMisfit: wrong shape", failure_kind="misfit", failed_run="r1")
    training = DeviceBrief(client_id=9, state="training", last_seen=seen, runs=["r1"])
    tally = SiteRun(run_id="r1", version=4, tasks=2, answered=0, failed=1)
    await store.report_site(EdgeRegistration(
        edge_id=0, name="lyon", devices=10_000, report_s=2.0, states={"failed": 1, "training": 1, "idle": 9_998},
        device_page=[failed, training], runs=[tally]))
    (site,) = await store.sites()
    assert (site.devices, site.report_s, site.states) == (10_000, 2.0, {"failed": 1, "training": 1, "idle": 9_998})
    assert site.device_page == [failed, training] and site.runs == [tally]
    assert site.status is None  # the registry keeps what was reported; its reader's clock says online or not
    # The next report replaces the devices and the runs: nothing of the last one lingers.
    await store.report_site(EdgeRegistration(edge_id=0, name="lyon", devices=1, states={"idle": 1}))
    (site,) = await store.sites()
    assert (site.devices, site.states, site.device_page, site.runs) == (1, {"idle": 1}, [], [])
