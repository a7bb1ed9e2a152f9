from __future__ import annotations

import pytest

from fl_services.shared.wire.admin import EdgeHealth
from tests.edge.harness import Edge

pytestmark = pytest.mark.anyio


async def test_health_needs_no_token_and_counts_registered_clients(edge: Edge) -> None:
    await edge.register(0)
    await edge.register(1)
    r = await edge.http.get("/health")
    assert r.status_code == 200
    health = EdgeHealth.model_validate_json(r.content)
    assert (health.clients, health.edge_id) == (2, 0)
