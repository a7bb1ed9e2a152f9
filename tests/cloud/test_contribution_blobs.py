"""A contribution's blob lives under its own key, SET before the submit script, which keeps or deletes it:
nothing of it outlives its buffer entry, and entries written inline (before) still read back."""
from __future__ import annotations

import pytest

from fl_services.cloud.global_states import GlobalStates
from fl_services.cloud.storage.redis import Entry, Keys, RedisStore
from tests.cloud.harness import Cloud, contribution, contribution_header, running_run, two_edge_config

pytestmark = pytest.mark.anyio


async def blob_keys(cloud: Cloud, run_id: str) -> list[bytes]:
    return [k async for k in cloud.redis.scan_iter(match=f"{cloud.prefix}:run:{run_id}:contribution:*")]


async def test_an_accepted_blob_is_kept_without_expiry_until_its_update_consumes_it(cloud: Cloud) -> None:
    run_id, global_ = await running_run(cloud, two_edge_config(), edges=(0, 1))
    assert (await cloud.submit(0, contribution(global_, run_id, edge_id=0))).status_code == 202
    [kept] = await blob_keys(cloud, run_id)
    assert await cloud.redis.ttl(kept) == -1  # permanent while buffered
    [(_, fields)] = await cloud.redis.xrange(Keys(cloud.prefix).buffer(run_id))
    assert fields[Entry.blob_key.encode()] == kept and Entry.blob.encode() not in fields
    assert (await cloud.submit(1, contribution(global_, run_id, edge_id=1))).status_code == 202
    await cloud.wait_version(run_id, 1)
    assert await blob_keys(cloud, run_id) == []  # deleted with the entries, in the update's commit


async def test_a_refused_or_repeated_submission_leaves_no_blob(cloud: Cloud) -> None:
    run_id, global_ = await running_run(cloud, two_edge_config(), edges=(0, 1))
    body = contribution(global_, run_id, edge_id=0)
    assert (await cloud.submit(0, body)).status_code == 202
    assert (await cloud.submit(0, body)).status_code == 202  # a retry: the duplicate's blob is dropped
    again = contribution(global_, run_id, edge_id=0, key="another key")  # the same slot: 409
    assert (await cloud.submit(0, again)).status_code == 409
    assert len(await blob_keys(cloud, run_id)) == 1


async def test_deleting_a_run_deletes_the_blobs_left_in_its_buffer(cloud: Cloud) -> None:
    run_id, global_ = await running_run(cloud, two_edge_config(), edges=(0, 1))
    assert (await cloud.submit(0, contribution(global_, run_id, edge_id=0))).status_code == 202
    await cloud.action(run_id, "stop")
    assert (await cloud.admin("DELETE", f"/api/v1/runs/{run_id}")).status_code == 204
    assert [k async for k in cloud.redis.scan_iter(match=f"{cloud.prefix}:run:{run_id}:*")] == []


async def test_an_entry_with_its_blob_inline_reads_back(cloud: Cloud) -> None:
    """Written by a cloud of before blob keys, still in the buffer after an upgrade."""
    run_id, global_ = await running_run(cloud, two_edge_config(), edges=(0, 1))
    header = contribution_header(run_id)
    body = contribution(global_, run_id)
    keys = Keys(cloud.prefix)
    await cloud.redis.xadd(keys.buffer(run_id), {Entry.blob.value: body, Entry.header.value: header.model_dump_json()})
    [entry] = await RedisStore(cloud.redis, keys).buffered(run_id, 2)
    assert (entry.blob, entry.header, entry.blob_ref) == (body, header, None)


async def test_an_unfinished_submission_blob_expires(cloud: Cloud, monkeypatch: pytest.MonkeyPatch) -> None:
    """A cloud killed between the SET and the script leaves a blob that expires on its own."""
    async def killed(*args, **kwargs):
        raise ConnectionError("the cloud died here")

    run_id, global_ = await running_run(cloud, two_edge_config(), edges=(0, 1))
    store = RedisStore(cloud.redis, Keys(cloud.prefix))
    monkeypatch.setattr(store.scripts, "submit", killed)
    with pytest.raises(ConnectionError):
        await store.submit(contribution_header(run_id), contribution(global_, run_id), True)
    [orphan] = await blob_keys(cloud, run_id)
    assert 0 < await cloud.redis.pttl(orphan) <= 3_600_000


async def test_the_served_global_state_is_read_once_per_version(cloud: Cloud) -> None:
    run_id, _ = await running_run(cloud)
    store = RedisStore(cloud.redis, Keys(cloud.prefix))
    reads = 0
    versioned = store.versioned_global

    async def counted(run):
        nonlocal reads
        reads += 1
        return await versioned(run)

    store.versioned_global = counted  # type: ignore[method-assign]
    states = GlobalStates(store)
    first = await states.blob(run_id, 0)
    assert await states.blob(run_id, 0) is first and reads == 1
    assert set(await states.layout(run_id)) == {"model"} and reads == 1
    states.keep(run_id, 1, b"newer")
    assert await states.blob(run_id, 1) == b"newer"
    states.retain([])
    assert await states.blob(run_id, 0) == first and reads == 2  # forgotten: read again
