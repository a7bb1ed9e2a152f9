"""The federation tier's one storage switch: every in-loop federation's cloud keeps its state where
`new_cloud_storage` says (the cloud's storage settings): the in-memory twin of the storage port, which the
contract tests (tests/cloud/storage/test_contract.py) prove equal to the Redis adapter. Real processes keep
a real Redis (tests/integration)."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

Storage = Callable[[], dict[str, Any]]


@pytest.fixture(scope="session")
def new_cloud_storage() -> Storage:
    """Storage settings for one more cloud: its own in-memory store."""
    return lambda: {"storage": "memory"}


@pytest.fixture
def cloud_storage(new_cloud_storage: Storage) -> dict[str, Any]:
    """The storage of this test's cloud."""
    return new_cloud_storage()
