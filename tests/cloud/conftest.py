from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.cloud.harness import Cloud, running_cloud


@pytest.fixture
async def cloud(redis_url: str) -> AsyncIterator[Cloud]:
    async with running_cloud(redis_url) as c:
        yield c
