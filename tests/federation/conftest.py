"""The federation tier's one storage switch: every in-loop federation's cloud keeps its state where
`new_cloud_storage` says (the cloud's storage settings)."""
from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest

Storage = Callable[[], dict[str, Any]]


@pytest.fixture(scope="session")
def new_cloud_storage(redis_url: str) -> Storage:
    """Storage settings for one more cloud: the session's private redis-server, under a key prefix of its own."""
    return lambda: {"redis_url": redis_url, "key_prefix": f"fed-{uuid.uuid4().hex}"}


@pytest.fixture
def cloud_storage(new_cloud_storage: Storage) -> dict[str, Any]:
    """The storage of this test's cloud."""
    return new_cloud_storage()
