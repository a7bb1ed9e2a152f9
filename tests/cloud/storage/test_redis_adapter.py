"""What the Redis adapter promises beyond the port's contract: nothing of redis-py leaves it (its exceptions
become the port's), its scripts come from the package's .lua files, and nothing else in the cloud imports
redis."""
from __future__ import annotations

import ast
import subprocess
import sys
import uuid
from importlib.resources import files
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from fl_services.cloud.storage import Lease, StorageError, StorageUnavailable
from fl_services.cloud.storage.redis import Keys, RedisStore
from fl_services.cloud.storage.redis.scripts import Scripts, source
from fl_services.fedctl.redis_server import free_port
from fl_services.shared.wire.admin import AuditRecord
from fl_services.shared.wire.edge_cloud import EdgeRegistration
from tests.cloud.harness import contribution_header
from tests.cloud.storage.test_contract import CONFIG, record

pytestmark = pytest.mark.anyio
ROOT = Path(__file__).resolve().parents[3]


async def _hear(message: str) -> None:
    raise AssertionError("nothing can be heard from a Redis that is not there")


async def _subscribed() -> None:
    raise AssertionError("no subscription to a Redis that is not there")


# Every coroutine of the port, with arguments: against a Redis that is not there, each raises the port's
# StorageUnavailable, never redis-py's ConnectionError.
CALLS = {
    "ping": (), "migrate": (), "create_run": ("r", CONFIG, b"g"), "config": ("r",), "status": ("r",), "info": ("r",),
    "infos": (["r"],), "run_ids": (), "active_runs": (), "transition": ("r", "start"), "note_waiting": ("r", "w"),
    "global_blob": ("r",),
    "versioned_global": ("r",), "cloud_state_blob": ("r",), "history": ("r",), "history_since": ("r", 0),
    "fill_evaluation": ("r", record(1)), "delete_run": ("r",), "ended_runs": (),
    "submit": (contribution_header("r"), b"blob", True), "has_pending": ("r", 0), "buffered": ("r", 1),
    "buffered_headers": ("r",), "commit_update": ("r", 0, [], b"g", b"s", record(1), False),
    "register_edge": (EdgeRegistration(edge_id=0),), "edge_known": (0,), "registered_edges": (),
    "acquire_lease": ("r", 1.0, "replica"), "extend_lease": (Lease("r", "t", 1.0),),
    "release_lease": (Lease("r", "t", 1.0),), "publish": ("m",), "listen": (_subscribed, _hear),
    "audit": (AuditRecord(at=record(1).started_at, actor="a", action="create", target="r"), 10),
    "audit_log": (10,), "revoke_token": ("device-1",), "revoked_tokens": (),
}


def test_every_coroutine_of_the_port_is_checked_here() -> None:
    from fl_services.cloud.storage import ports

    port = {name for cls in (ports.Runs, ports.ContributionBuffer, ports.EdgeRegistry, ports.UpdateLeases,
                             ports.Events, ports.AuditLog, ports.RevokedTokens)
            for name, value in vars(cls).items() if not name.startswith("_") and callable(value)}
    assert port - {"new_run_id"} == set(CALLS)


@pytest.mark.parametrize("method", sorted(CALLS))
async def test_a_redis_that_is_not_there_raises_the_ports_unavailable(method: str) -> None:
    client = aioredis.Redis.from_url(f"redis://127.0.0.1:{free_port()}/0", socket_connect_timeout=2)
    try:
        with pytest.raises(StorageUnavailable, match="(?i)connect"):
            await getattr(RedisStore(client, Keys("test")), method)(*CALLS[method])
    finally:
        await client.aclose()


async def test_any_other_redis_error_is_the_ports_storage_error(redis_url: str) -> None:
    client = aioredis.Redis.from_url(redis_url)
    keys = Keys(f"test-{uuid.uuid4().hex}")
    try:
        await client.set(keys.meta("r"), "not a hash")  # WRONGTYPE for every read of the run
        with pytest.raises(StorageError, match="WRONGTYPE") as raised:
            await RedisStore(client, keys).info("r")
        assert type(raised.value) is StorageError
    finally:
        await client.aclose()


def test_every_script_is_a_file_of_the_package_registered_with_its_placeholders_filled() -> None:
    package = files("fl_services.cloud.storage.redis")
    scripts = sorted(p.name.removesuffix(".lua") for p in package.iterdir() if p.name.endswith(".lua"))
    assert scripts == sorted(vars(Scripts(aioredis.Redis())))
    for name in scripts:
        assert "$" not in source(name), name
        assert "redis.call(" in source(name)


def test_nothing_in_the_cloud_but_its_redis_adapter_imports_redis() -> None:
    wrong = []
    for path in sorted((ROOT / "cloud").rglob("*.py")):
        if (ROOT / "cloud" / "storage" / "redis") in path.parents:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            wrong += [f"{path.relative_to(ROOT)}:{node.lineno}: {n}" for n in names if n.split(".")[0] == "redis"]
    assert not wrong, "\n".join(wrong)


def test_the_orchestrator_routes_and_storage_port_load_no_redis() -> None:
    code = ("import sys, fl_services.cloud.orchestrator, fl_services.cloud.storage, fl_services.cloud.routes.runs, "
            "fl_services.cloud.routes.edges, fl_services.cloud.routes.admin, fl_services.cloud.retention; "
            "print(sorted(m for m in sys.modules if m == 'redis' or m.startswith('redis.')))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          check=True)
    assert done.stdout.strip() == "[]", done.stdout


async def test_migrating_gives_a_live_run_over_registered_devices_its_member_index(redis_url: str) -> None:
    """A run accepted contributions before the index of which site holds each device existed: migrating builds it
    from what was accepted, so a device another site declared first is still refused there."""
    from fl_services.cloud.storage import MembersElsewhere
    from fl_services.cloud.storage.redis.connection import clients
    from fl_services.shared.core.config import RunConfig
    from fl_services.shared.core.reports import Member

    config = RunConfig.model_validate({**CONFIG.model_dump(), "selection": {"min_devices": 1}})
    async with clients(redis_url, {}, max_connections=4, pool_timeout_s=5.0) as (client, bulk):
        keys = Keys(f"test-{uuid.uuid4().hex}")
        store = RedisStore(client, keys, bulk)
        await store.create_run("r", config, b"g")
        await store.transition("r", "start")
        declared = [Member(client_id=k, num_samples=10) for k in (7, 8)]  # what the index is rebuilt from
        assert (await store.submit(contribution_header("r", edge_id=0, members=declared), b"b", True, (7, 8))).accepted
        assert await client.delete(keys.member_sites("r")) == 1  # as a store written before the index
        await store.migrate()
        await store.migrate()  # idempotent
        with pytest.raises(MembersElsewhere) as refused:
            await store.submit(contribution_header("r", edge_id=1), b"b", True, (8, 9))
        assert refused.value.holders == {8: 0}


async def test_a_site_registry_written_before_its_index_gets_it_whole_at_the_first_report(redis_url: str) -> None:
    """The index of each edge's site name is built from the records when it is missing: an edge that registered
    before it existed still leaves its old name when it renames itself, whichever edge reports first."""
    from fl_services.cloud.storage import Conflict
    from fl_services.cloud.storage.redis.connection import clients

    async with clients(redis_url, {}, max_connections=4, pool_timeout_s=5.0) as (client, bulk):
        keys = Keys(f"test-{uuid.uuid4().hex}")
        store = RedisStore(client, keys, bulk)
        for edge_id, name in [(0, "lyon"), (1, "paris"), (2, "oslo")]:
            await store.report_site(EdgeRegistration(edge_id=edge_id, name=name))
        assert await client.hgetall(keys.site_names) == {b"0": b"lyon", b"1": b"paris", b"2": b"oslo"}
        assert await client.delete(keys.site_names) == 1  # as a registry written before the index
        await store.report_site(EdgeRegistration(edge_id=2, name="oslo"))
        await store.report_site(EdgeRegistration(edge_id=1, name="rome"))
        with pytest.raises(Conflict, match="edge 0's, not edge 1's"):
            await store.report_site(EdgeRegistration(edge_id=1, name="lyon"))
        assert [(s.name, s.edge_id) for s in await store.sites()] == [("lyon", 0), ("oslo", 2), ("rome", 1)]
        await store.remove_site("lyon")
        assert await client.hgetall(keys.site_names) == {b"1": b"rome", b"2": b"oslo"}
