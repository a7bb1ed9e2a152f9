from __future__ import annotations

import pytest

from shared.schemas import CloudHealth
from tests.cloud.harness import Cloud

pytestmark = pytest.mark.anyio


async def test_health_needs_no_token_and_says_redis_answered(cloud: Cloud) -> None:
    r = await cloud.http.get("/health")
    assert r.status_code == 200
    assert CloudHealth.model_validate_json(r.content) == CloudHealth()
