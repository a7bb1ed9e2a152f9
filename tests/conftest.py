"""Shared test fixtures: one real, private redis-server per test session."""
from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from shared.redis_server import RedisServer


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
