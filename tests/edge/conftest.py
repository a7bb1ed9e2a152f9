from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.edge.harness import Edge, running_edge


@pytest.fixture
async def edge() -> AsyncIterator[Edge]:
    async with running_edge() as e:
        yield e
