"""Shared test fixtures: one real, private redis-server per test session (per worker); the wheel, built once
(per worker); the order the suite runs in."""
from __future__ import annotations

import gc
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from fl_services.fedctl.redis_server import RedisServer
from fl_services.shared.runtime import tune_collector


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """URL of a real Redis: $REDIS_URL when set, else a private redis-server started for the session.

    Tests isolate themselves with their own key prefix, never by flushing the database.
    """
    url = os.environ.get("REDIS_URL")
    if url:
        yield url
        return
    with RedisServer(appendonly=False) as server:
        yield server.url


@pytest.fixture(autouse=True, scope="session")
def one_torch_thread() -> Iterator[None]:
    """Every test trains with one torch thread, as each client process does by default.

    The cores are shared with the service processes the integration tests start, and the reference
    runner only matches a distributed run bit for bit when both sum in the same order.
    """
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No FL_CLOUD_/FL_EDGE_/FL_CLIENT_ variable of the caller's environment reaches the settings classes."""
    for key in list(os.environ):
        if key.startswith(("FL_CLOUD_", "FL_EDGE_", "FL_CLIENT_")):
            monkeypatch.delenv(key)
    return monkeypatch


@pytest.fixture
def anyio_backend() -> str:
    """The services run on asyncio; anyio tests need not try trio."""
    return "asyncio"


@pytest.fixture(scope="session")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The project's wheel, built once for the tests that install it into fresh venvs (the services' install
    and a device's)."""
    from tests.integration.test_wheel import build_wheel

    return build_wheel(tmp_path_factory.mktemp("wheel-build"))


def pytest_configure(config: pytest.Config) -> None:
    """The garbage collector as the services set it (docs/decisions/collector-thresholds.md): at Python's default
    it took 11% of the CPU of the cloud, edge and federation tests."""
    tune_collector()


def pytest_collection_finish(session: pytest.Session) -> None:
    """What collection built (modules, test items) lives as long as the session: kept out of every later
    collection."""
    gc.collect()
    gc.freeze()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The longest tests first (those marked slow, in their order): `./fl test` hands each worker a whole test
    file at a time in this order (--dist loadfile, not reordered), so the files holding minute-long tests start
    at once and the workers end together on short ones."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
