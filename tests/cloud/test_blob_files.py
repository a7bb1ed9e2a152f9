"""Contributions' blobs in files on a volume the replicas share (FL_CLOUD_BLOB_DIR): a file is there for every
buffered entry that references it, nothing of a refused or consumed one stays, an orphan is swept by age and a
referenced file never, and each crash window (between the write and the script, after the script, before and
after the update's commit) loses no accepted contribution and counts none twice."""
from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from fl_services.cloud.config import CloudSettings
from fl_services.cloud.storage import StorageRefused, StorageUnavailable, now
from fl_services.cloud.storage.blob_files import BlobFiles
from fl_services.cloud.storage.redis import Entry, Keys, RedisStore, prepared_blob_files, redis_store
from fl_services.shared.core.reports import RoundRecord
from tests.cloud.harness import (
    Cloud,
    contribution,
    contribution_header,
    running_cloud,
    running_run,
    small_config,
    two_edge_config,
)
from tests.edge.harness import until
from tests.integration.test_redis_auth import run_cloud

pytestmark = pytest.mark.anyio


# Three edges to a buffer of three: only the test consumes the entries of edges 0 and 1.
UNCONSUMED = small_config(topology={"num_edges": 3, "buffer_size": 3})
RECORD = RoundRecord(round=0, version=1, edges=[0, 1], clients=[], contributions=[], train_loss=0, test_loss=0,
                     test_accuracy=0, started_at=now(), finished_at=now(), elapsed_s=0)


def blob_files(cloud: Cloud, blob_dir: Path) -> list[str]:
    return sorted(os.listdir(blob_dir / cloud.prefix))


def age(directory: Path, seconds: float) -> None:
    """Every file in `directory` last written `seconds` ago."""
    then = time.time() - seconds
    for name in os.listdir(directory):
        os.utime(directory / name, (then, then))


@pytest.fixture
async def cloud(redis_url: str, tmp_path: Path) -> AsyncIterator[Cloud]:
    async with running_cloud(redis_url, blob_dir=tmp_path) as c:
        yield c


def store_of(cloud: Cloud) -> RedisStore:
    store = cloud.app.state.store
    assert isinstance(store, RedisStore) and store.files is not None
    return store


async def test_an_accepted_blob_is_a_file_named_in_its_entry_until_its_update_consumes_it(
        cloud: Cloud, tmp_path: Path) -> None:
    run_id, global_ = await running_run(cloud, two_edge_config(), edges=(0, 1))
    body = contribution(global_, run_id, edge_id=0)
    assert (await cloud.submit(0, body)).status_code == 202
    [name] = blob_files(cloud, tmp_path)
    assert (tmp_path / cloud.prefix / name).read_bytes() == body
    [(_, fields)] = await cloud.redis.xrange(Keys(cloud.prefix).buffer(run_id))
    assert fields[Entry.blob_file.encode()] == name.encode() and Entry.blob_key.encode() not in fields
    assert [k async for k in cloud.redis.scan_iter(match=f"{cloud.prefix}:run:{run_id}:contribution:*")] == []
    assert (await cloud.submit(1, contribution(global_, run_id, edge_id=1))).status_code == 202
    await cloud.wait_version(run_id, 1)
    # Deleted once the update committed: just after the version is visible, so waited for.
    await until(lambda: not blob_files(cloud, tmp_path), timeout=30, what="the consumed blob file deleted")


async def test_a_refused_or_repeated_submission_leaves_no_file(cloud: Cloud, tmp_path: Path) -> None:
    run_id, global_ = await running_run(cloud, two_edge_config(), edges=(0, 1))
    body = contribution(global_, run_id, edge_id=0)
    assert (await cloud.submit(0, body)).status_code == 202
    [kept] = blob_files(cloud, tmp_path)
    assert (await cloud.submit(0, body)).status_code == 202  # a retry: the duplicate's file is deleted
    assert (await cloud.submit(0, contribution(global_, run_id, edge_id=0, key="another"))).status_code == 409
    assert blob_files(cloud, tmp_path) == [kept]


async def test_deleting_a_run_deletes_the_files_left_in_its_buffer(cloud: Cloud, tmp_path: Path) -> None:
    run_id, global_ = await running_run(cloud, two_edge_config(), edges=(0, 1))
    assert (await cloud.submit(0, contribution(global_, run_id, edge_id=0))).status_code == 202
    await cloud.action(run_id, "stop")
    assert (await cloud.admin("DELETE", f"/api/v1/runs/{run_id}")).status_code == 204
    assert blob_files(cloud, tmp_path) == []


async def test_an_orphan_is_swept_by_age_and_a_referenced_file_never(cloud: Cloud, tmp_path: Path) -> None:
    run_id, global_ = await running_run(cloud, two_edge_config(), edges=(0, 1))
    store = store_of(cloud)
    assert (await cloud.submit(0, contribution(global_, run_id, edge_id=0))).status_code == 202
    [referenced] = blob_files(cloud, tmp_path)
    orphan = store.files.new_name()  # type: ignore[union-attr]
    store.files.write(orphan, b"a cloud died before its submit script")  # type: ignore[union-attr]
    (tmp_path / cloud.prefix / ".partial-x.safetensors").write_bytes(b"died mid-write")
    assert await store.sweep_blob_files() == []  # young: a submit may be about to reference it
    age(tmp_path / cloud.prefix, 2 * 3600)
    assert sorted(await store.sweep_blob_files()) == sorted([orphan, ".partial-x.safetensors"])
    assert blob_files(cloud, tmp_path) == [referenced]
    assert await cloud.redis.exists(Keys(cloud.prefix).swept_blob_file(referenced)) == 0
    assert (await cloud.submit(1, contribution(global_, run_id, edge_id=1))).status_code == 202
    assert (await cloud.wait_version(run_id, 1))["version"] == 1  # the old, referenced blob was counted


async def test_a_submit_stalled_past_the_sweep_is_refused_not_buffered(cloud: Cloud, tmp_path: Path) -> None:
    """Its file swept as an orphan before its script ran: the script refuses to reference it (503: the edge
    retries), rather than buffering an entry whose blob is gone."""
    run_id, global_ = await running_run(cloud, two_edge_config(), edges=(0, 1))
    store = store_of(cloud)
    files = store.files
    assert files is not None
    write, loop = files.write, asyncio.get_running_loop()

    def stalled(name: str, blob: bytes) -> None:
        write(name, blob)
        age(files.directory, 2 * 3600)  # another replica's sweep, while this submit stalls
        assert asyncio.run_coroutine_threadsafe(store.sweep_blob_files(), loop).result() == [name]

    files.write = stalled  # type: ignore[method-assign]
    with pytest.raises(StorageUnavailable):
        await store.submit(contribution_header(run_id), contribution(global_, run_id), True)
    assert await store.buffered(run_id, 2) == [] and blob_files(cloud, tmp_path) == []


async def test_a_cloud_killed_between_the_write_and_the_script_leaves_an_orphan_only(
        cloud: Cloud, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async def killed(*args, **kwargs):
        raise ConnectionError("the cloud died here")

    run_id, global_ = await running_run(cloud, two_edge_config(), edges=(0, 1))
    store = store_of(cloud)
    monkeypatch.setattr(store.scripts, "submit", killed)
    with pytest.raises(ConnectionError):
        await store.submit(contribution_header(run_id), contribution(global_, run_id), True)
    [orphan] = blob_files(cloud, tmp_path)  # kept: had the script run, an entry would reference it
    monkeypatch.undo()
    assert await store.buffered(run_id, 2) == []
    age(tmp_path / cloud.prefix, 2 * 3600)
    assert await store.sweep_blob_files() == [orphan]


async def test_a_retry_after_the_script_ran_is_a_duplicate_and_the_first_file_is_what_counts(
        cloud: Cloud, tmp_path: Path) -> None:
    """Killed after the script (the edge got no answer): the retry, under the same key, buffers nothing more."""
    run_id, global_ = await running_run(cloud, two_edge_config(), edges=(0, 1))
    store = store_of(cloud)
    header, body = contribution_header(run_id), contribution(global_, run_id)
    assert (await store.submit(header, body, True)).duplicate is False
    [first] = blob_files(cloud, tmp_path)
    assert (await store.submit(header, body, True)).duplicate is True
    [entry] = await store.buffered(run_id, 2)
    assert (entry.blob_ref, entry.blob, blob_files(cloud, tmp_path)) == (first, body, [first])


async def test_an_update_that_did_not_commit_keeps_the_files_and_one_that_did_leaves_orphans_only(
        cloud: Cloud, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Killed before the EXEC: the entries and their files are there for the redo. Killed after it, before the
    files' deletion: nothing references them (nothing counted twice), and a sweep deletes them."""
    run_id, global_ = await running_run(cloud, UNCONSUMED, edges=(0, 1))
    store = store_of(cloud)
    for edge in (0, 1):
        assert (await cloud.submit(edge, contribution(global_, run_id, edge_id=edge))).status_code == 202
    entries = await store.buffered(run_id, 2)
    assert not await store.commit_update(run_id, 5, entries, b"g", b"c", RECORD, False)  # not committed
    assert len(blob_files(cloud, tmp_path)) == 2 and await store.buffered(run_id, 2) == entries

    async def killed(names: list[str]) -> None:
        raise SystemExit("the cloud died between its commit and the deletion of the files")

    monkeypatch.setattr(store, "_delete_files", killed)
    with pytest.raises(SystemExit):
        await store.commit_update(run_id, 0, entries, b"g", b"c", RECORD, False)
    assert await store.buffered(run_id, 2) == [] and len(blob_files(cloud, tmp_path)) == 2
    age(tmp_path / cloud.prefix, 2 * 3600)
    assert len(await store.sweep_blob_files()) == 2 and blob_files(cloud, tmp_path) == []


async def test_a_missing_file_of_a_buffered_entry_is_an_error_not_a_skipped_update(
        cloud: Cloud, tmp_path: Path) -> None:
    run_id, global_ = await running_run(cloud, two_edge_config(), edges=(0, 1))
    store = store_of(cloud)
    assert (await cloud.submit(0, contribution(global_, run_id, edge_id=0))).status_code == 202
    [name] = blob_files(cloud, tmp_path)
    (tmp_path / cloud.prefix / name).unlink()
    with pytest.raises(LookupError, match="FL_CLOUD_BLOB_DIR"):
        await store.buffered(run_id, 2)
    without = RedisStore(store.r, store.k)  # a replica that has no blob directory
    with pytest.raises(LookupError, match="no blob directory"):
        await without.buffered(run_id, 2)


async def test_entries_consumed_by_another_replica_while_read_are_read_again(
        redis_url: str, tmp_path: Path) -> None:
    async with running_cloud(redis_url, blob_dir=tmp_path, replica_id="a") as a,\
            running_cloud(redis_url, prefix=a.prefix, blob_dir=tmp_path, replica_id="b") as b:
        run_id, global_ = await running_run(a, UNCONSUMED, edges=(0, 1))
        assert (await a.submit(0, contribution(global_, run_id, edge_id=0))).status_code == 202
        store, other = store_of(a), store_of(b)
        read, loop = store._read_files, asyncio.get_running_loop()

        def consumed_meanwhile(names: list[str]) -> list[bytes | None]:
            async def commit() -> bool:
                return await other.commit_update(run_id, 0, await other.buffered(run_id, 2), b"g", b"c", RECORD,
                                                 False)

            assert asyncio.run_coroutine_threadsafe(commit(), loop).result()
            store._read_files = read  # type: ignore[method-assign]
            return read(names)

        store._read_files = consumed_meanwhile  # type: ignore[method-assign]
        assert await store.buffered(run_id, 2) == []


async def test_two_replicas_sharing_the_directory_and_redis_consume_each_others_files(
        redis_url: str, tmp_path: Path) -> None:
    async with running_cloud(redis_url, blob_dir=tmp_path, replica_id="a", lease_s=1.0) as a,\
            running_cloud(redis_url, prefix=a.prefix, blob_dir=tmp_path, replica_id="b", lease_s=1.0) as b:
        run_id, global_ = await running_run(a, two_edge_config(), edges=(0, 1))
        assert (await a.submit(0, contribution(global_, run_id, edge_id=0))).status_code == 202
        assert (await b.submit(1, contribution(global_, run_id, edge_id=1))).status_code == 202
        info = await b.wait_version(run_id, 1)
        assert info["version"] == 1
        [record] = await a.history(run_id)
        assert sorted(c["edge_id"] for c in record["contributions"]) == [0, 1]
        assert blob_files(a, tmp_path) == []


def test_blob_dir_is_for_the_redis_storage(tmp_path: Path, clean_env: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="unset blob_dir"):
        CloudSettings(storage="memory", blob_dir=tmp_path)
    with pytest.raises(ValueError, match="without '/'"):
        CloudSettings(blob_dir=tmp_path, key_prefix="a/b")
    assert CloudSettings(blob_dir=tmp_path).blob_dir == tmp_path


def test_a_blob_is_durable_under_its_name_or_not_there(tmp_path: Path) -> None:
    files = BlobFiles(tmp_path, "fl", orphan_s=60)
    files.prepare()
    name = files.new_name()
    files.write(name, b"bytes")
    assert files.read(name) == b"bytes" and os.listdir(files.directory) == [name]  # no partial left
    files.delete([name, name])  # deleting what is gone is no error (a sweep and an update may both)
    with pytest.raises(FileNotFoundError):
        files.read(name)


async def test_a_cloud_sweeps_old_orphans_as_it_starts(redis_url: str, tmp_path: Path) -> None:
    files = BlobFiles(tmp_path, f"test-{uuid.uuid4().hex}", orphan_s=60)
    files.prepare()
    orphan, young = files.new_name(), files.new_name()
    files.write(orphan, b"left by a cloud killed before its submit script")
    age(files.directory, 120)
    files.write(young, b"a submit of another replica, about to run its script")
    async with redis_store(redis_url, {}, prefix=files.directory.name, max_connections=4, pool_timeout_s=5,
                           blob_dir=tmp_path, blob_orphan_s=60):
        deadline = time.monotonic() + 10
        while (files.directory / orphan).exists():
            assert time.monotonic() < deadline, "the orphan was not swept at start"
            await asyncio.sleep(0.02)
    assert os.listdir(files.directory) == [young]


async def test_a_blob_that_cannot_be_written_is_a_503_and_leaves_nothing(
        cloud: Cloud, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run_id, global_ = await running_run(cloud, two_edge_config(), edges=(0, 1))

    def full(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    answer = await cloud.submit(0, contribution(global_, run_id, edge_id=0))
    monkeypatch.undo()
    assert answer.status_code == 503 and "No space left" in answer.text
    assert await store_of(cloud).buffered(run_id, 2) == [] and blob_files(cloud, tmp_path) == []  # no partial


async def test_a_blob_dir_that_cannot_be_written_is_refused_at_start_not_by_every_submit(
        redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "a-file").touch()
    with pytest.raises(StorageRefused, match=r"FL_CLOUD_BLOB_DIR=.*a-file cannot hold .*Not a directory"):
        async with redis_store(redis_url, {}, prefix="fl", max_connections=4, pool_timeout_s=5,
                               blob_dir=tmp_path / "a-file"):
            pass
    existing = tmp_path / "volume" / "fl"
    existing.mkdir(parents=True)

    def read_only(fd: int) -> None:
        raise OSError(30, "Read-only file system")

    monkeypatch.setattr(os, "fsync", read_only)
    with pytest.raises(StorageRefused, match="Read-only file system"):
        prepared_blob_files(tmp_path / "volume", prefix="fl", orphan_s=60)
    monkeypatch.undo()
    assert os.listdir(existing) == []  # the write that found it out left nothing
    prepared_blob_files(tmp_path / "volume", prefix="fl", orphan_s=60)
    assert os.listdir(existing) == []


@pytest.mark.slow
def test_a_cloud_whose_blob_dir_is_a_file_stops_at_start_up_with_one_clear_line(tmp_path: Path) -> None:
    (tmp_path / "a-file").touch()
    result = run_cloud({"FL_CLOUD_BLOB_DIR": str(tmp_path / "a-file")})  # no Redis needed: it stops before
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert "FL_CLOUD_BLOB_DIR" in result.stderr and "not starting" in result.stderr, result.stderr
