"""The federation tier's one storage switch: every in-loop federation's cloud keeps its state where
`cloud_storage` says (the cloud's storage settings)."""
from __future__ import annotations

import uuid
from typing import Any

import pytest


@pytest.fixture
def cloud_storage(redis_url: str) -> dict[str, Any]:
    """The session's private redis-server, under a key prefix of this test's own."""
    return {"redis_url": redis_url, "key_prefix": f"fed-{uuid.uuid4().hex}"}
