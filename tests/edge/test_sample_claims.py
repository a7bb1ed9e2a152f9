"""A client's claimed sample count cannot take a round over: where the edge can derive the count from the
config and seed (built-in data sets, an npz file it holds) a wrong claim is refused with 422 and changes
nothing; elsewhere (an imported loader) the edge's max_client_samples caps what a claim weighs. Before, a
client claiming 10^12 samples got 0.999999999 of the weight and the global step was its update."""
from __future__ import annotations

import asyncio

import pytest

from fl_services.shared.core.config import RunConfig
from fl_services.shared.core.federation import known_num_samples
from fl_services.shared.core.tensors import Tensors, encode
from fl_services.shared.wire.client_edge import ClientResultHeader, ClientTaskHeader
from tests.edge.harness import CONFIG, CloudDouble, Edge, running_edge, serve_tasks, true_samples, until, zeros_like
from tests.web import detail_of

pytestmark = pytest.mark.anyio

CLAIM = 10**12
IMPORTED = RunConfig(model={"name": "logreg"}, rounds=2,
                     data={"dataset": "tests.shared.user_factories:as_dict", "partition": "file", "num_clients": 4})


def answer(edge: Edge, claims: dict[int, int], refused: list[str]):
    """Client k answers with claims[k] samples (its true count otherwise); a refusal is noted, then the
    client answers again with its true count, as an honest retry would."""
    async def reply(k: int, tensors: Tensors, header: ClientTaskHeader) -> None:
        true = true_samples(header.config, k)
        for claim in (claims.get(k, true), true):
            message = ClientResultHeader(task_id=header.task_id, client_id=k, num_samples=claim, loss=0.5)
            r = await edge.send_result(k, encode(zeros_like(tensors), message))
            if r.status_code == 422:
                refused.append(detail_of(r, 422, "num_samples"))
                assert edge.board.results() == [] or all(x.client_id != k for x in edge.board.results())
                continue
            assert r.status_code in (202, 409), r.text
            return

    return reply


async def test_a_wrong_claim_on_a_built_in_data_set_is_refused_and_changes_nothing() -> None:
    counts = known_num_samples(CONFIG)
    assert counts is not None and len(set(counts)) >= 1 and all(c < 1000 for c in counts)  # digits
    cloud = CloudDouble(CONFIG)
    refused: list[str] = []
    async with running_edge(cloud_transport=cloud.transport()) as edge:
        clients = asyncio.create_task(serve_tasks(edge, range(4), answer(edge, {0: CLAIM}, refused)))
        try:
            await until(lambda: cloud.contributions, what="the round is submitted")
        finally:
            clients.cancel()
    assert len(refused) == 1 and str(CLAIM) in refused[0] and str(counts[0]) in refused[0]
    contribution = cloud.contributions[0]
    assert {c.client_id: c.num_samples for c in contribution.clients} == dict(enumerate(counts))
    assert contribution.weight == sum(counts)  # client 0 weighs its true share, not 0.999999999


async def test_where_the_edge_cannot_know_the_count_max_client_samples_caps_a_claim() -> None:
    assert known_num_samples(IMPORTED) is None  # the edge runs no user loader
    cloud = CloudDouble(IMPORTED)
    refused: list[str] = []
    async with running_edge(cloud_transport=cloud.transport(), max_client_samples=50) as edge:
        clients = asyncio.create_task(serve_tasks(edge, range(4), answer(edge, {0: CLAIM}, refused)))
        try:
            await until(lambda: cloud.contributions, what="the round is submitted")
        finally:
            clients.cancel()
    assert refused == []
    contribution = cloud.contributions[0]
    assert {c.client_id: c.num_samples for c in contribution.clients} == {0: 50, 1: 10, 2: 10, 3: 10}
    assert contribution.weight == 50 + 3 * 10
