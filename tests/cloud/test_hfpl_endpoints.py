"""The cloud's edge API with the asynchronous prototype algorithm (hfpl): triples, buffer, staleness.

Same in-process cloud on a real Redis as test_bad_input.py, whose helpers are reused. The run has
L = 3 edges and a buffer of B = 2, so one triple alone stays in the buffer and two trigger an update.
"""
from __future__ import annotations

import math

import pytest
import torch

from fl_services.cloud.storage.redis import Keys
from fl_services.shared.core.reports import ClientParticipation
from fl_services.shared.core.tensors import Tensors, encode
from tests.cloud.harness import (
    Cloud,
    contribution,
    contribution_header,
    running_run,
    small_config,
    two_edge_config,
)
from tests.web import detail_of

pytestmark = pytest.mark.anyio

NUM_CLIENTS, NUM_CLASSES, DIM, CAP = 6, 10, 8, 5  # digits has 10 classes
PER_EDGE = NUM_CLIENTS // 3  # clients k ≡ l (mod 3): edge 0 serves clients 0 and 3
MAX_ROWS = CAP * PER_EDGE  # an edge's row limit: feature_cap · its clients
CONFIG = small_config(
    algorithm="hfpl", rounds=20,
    data={"dataset": "digits", "partition": "dirichlet", "alpha": 0.3, "num_clients": NUM_CLIENTS},
    topology={"num_edges": 3, "buffer_size": 2}, params={"feature_dim": DIM, "feature_cap": CAP},
)
EDGES = (0, 1, 2)


def triple(n: int = 7, **replace: torch.Tensor) -> Tensors:  # n ≤ MAX_ROWS = 10
    """A valid edge triple (C^l, N^l, X^l) with n feature rows; `replace` swaps single tensors."""
    good = {
        WIRE["prototypes"]: torch.arange(NUM_CLASSES * DIM, dtype=torch.float64).reshape(NUM_CLASSES, DIM) / 10,
        WIRE["counts"]: torch.tensor([2, 1, 0, 2, 1, 1, 0, 2, 1, 1], dtype=torch.float64),
        WIRE["features"]: torch.randn(n, DIM, generator=torch.Generator().manual_seed(n)),
        WIRE["labels"]: torch.arange(n, dtype=torch.int64) % NUM_CLASSES,
    }
    return {**good, **{WIRE[k]: t for k, t in replace.items()}}


# The triple's tensors as the record codec names them on the wire (group/name).
WIRE = {"prototypes": "prototypes/means", "counts": "prototypes/counts", "features": "sample/features",
        "labels": "sample/labels"}


def message(run_id: str, edge_id: int, base_version: int, key: str | None = None,
            tensors: Tensors | None = None) -> bytes:
    # Clients report held-out metrics, as real hfpl clients do, so the cloud's evaluation is finite.
    clients = [ClientParticipation(client_id=edge_id, num_samples=10, loss=0.5,
                                   metrics={"accuracy": 0.5, "test_loss": 1.0})]
    header = contribution_header(run_id, edge_id=edge_id, base_version=base_version, key=key, clients=clients,
                                 weight=1.0)  # hfpl weighs every client 1
    return encode(triple() if tensors is None else tensors, header)


async def accepted(cloud: Cloud, edge_id: int, blob: bytes, buffered: int) -> None:
    r = await cloud.submit(edge_id, blob)
    assert r.status_code == 202, r.text
    assert r.json() == {"accepted": True, "duplicate": False, "buffered": buffered}


async def hfpl_run(cloud: Cloud) -> str:
    run_id, global_ = await running_run(cloud, CONFIG, edges=EDGES)
    means = global_[WIRE["prototypes"]]
    assert (means.shape, means.dtype) == ((NUM_CLASSES, DIM), torch.float64)
    return run_id


async def advance(cloud: Cloud, run_id: str, version: int) -> None:
    """One cloud update from edges 1 and 2 on `version` (B = 2), waited for."""
    await accepted(cloud, 1, message(run_id, 1, version), buffered=1)
    await accepted(cloud, 2, message(run_id, 2, version), buffered=2)
    await cloud.wait_version(run_id, version + 1)


async def stream_length(cloud: Cloud, run_id: str) -> int:
    return await cloud.redis.xlen(Keys(cloud.prefix).buffer(run_id))


# =================================================================================================
# Accepted triples, idempotency, the one-triple-per-edge rule
# =================================================================================================
@pytest.mark.parametrize("n", [0, 6, MAX_ROWS], ids=["no-rows", "some-rows", "at-the-cap"])
async def test_valid_triple_accepted_once(cloud: Cloud, n: int) -> None:
    run_id = await hfpl_run(cloud)
    blob = message(run_id, 0, 0, tensors=triple(n))
    await accepted(cloud, 0, blob, buffered=1)
    before = await cloud.snapshot(run_id)
    again = await cloud.submit(0, blob)
    assert again.status_code == 202, again.text
    assert again.json() == {"accepted": True, "duplicate": True, "buffered": 1}
    assert await stream_length(cloud, run_id) == 1
    assert await cloud.snapshot(run_id) == before


async def test_second_triple_while_the_first_waits_in_the_buffer(cloud: Cloud) -> None:
    run_id = await hfpl_run(cloud)
    await advance(cloud, run_id, 0)
    await accepted(cloud, 0, message(run_id, 0, 0), buffered=1)  # stale, accepted; waits for a partner
    before = await cloud.snapshot(run_id)
    r = await cloud.submit(0, message(run_id, 0, 1, key="edge-0-on-version-1"))
    assert detail_of(r, 409) == ("edge 0 already has a contribution waiting in the buffer; "
                                 "it gets a new global state once that one is consumed")
    assert await cloud.snapshot(run_id) == before


async def test_long_poll_holds_back_an_edge_with_a_pending_triple(cloud: Cloud) -> None:
    run_id = await hfpl_run(cloud)
    await accepted(cloud, 0, message(run_id, 0, 0), buffered=1)
    waiting = await cloud.edge("GET", "/api/v1/edges/0/global", params={"after": -1, "timeout": 0.5})
    assert waiting.status_code == 204, waiting.text
    _, header = await cloud.global_state(1)  # edge 1 has nothing in the buffer
    assert (header.run_id, header.version) == (run_id, 0)


# =================================================================================================
# Staleness: accepted for hfpl, recorded by the update that consumes it
# =================================================================================================
async def test_stale_triple_accepted_and_its_staleness_recorded(cloud: Cloud) -> None:
    run_id = await hfpl_run(cloud)
    await advance(cloud, run_id, 0)
    await advance(cloud, run_id, 1)
    await accepted(cloud, 0, message(run_id, 0, 0), buffered=1)  # two versions behind
    await accepted(cloud, 1, message(run_id, 1, 2), buffered=2)
    info = await cloud.wait_version(run_id, 3)
    assert (info["version"], info["buffered"]) == (3, 0)
    history = (await cloud.admin("GET", f"/api/v1/runs/{run_id}/history")).json()
    assert [r["version"] for r in history] == [1, 2, 3]
    # The third update ran on version 2: staleness = 2 − base_version, in buffer (arrival) order.
    assert [(c["edge_id"], c["base_version"], c["staleness"]) for c in history[2]["contributions"]] ==\
        [(0, 0, 2), (1, 2, 0)]
    assert [(c["edge_id"], c["staleness"]) for r in history[:2] for c in r["contributions"]] ==\
        [(1, 0), (2, 0), (1, 0), (2, 0)]


async def test_fedavg_still_refuses_a_stale_contribution(cloud: Cloud) -> None:
    run_id, global_ = await running_run(cloud, two_edge_config(), edges=(0, 1))
    await cloud.submit(0, contribution(global_, run_id, edge_id=0))
    await cloud.submit(1, contribution(global_, run_id, edge_id=1))
    await cloud.wait_version(run_id, 1)
    before = await cloud.snapshot(run_id)
    r = await cloud.submit(0, contribution(global_, run_id, edge_id=0, key="late"))
    assert detail_of(r, 409) == "stale submission: base_version 0, current version 1"
    assert await cloud.snapshot(run_id) == before


# =================================================================================================
# Refused triples: 422, nothing changes
# =================================================================================================
def _bad(case: str) -> tuple[Tensors, str]:
    labels = torch.arange(7, dtype=torch.int64) % NUM_CLASSES
    counts = triple()[WIRE["counts"]]
    prototypes = triple()[WIRE["prototypes"]]
    whole = f"counts must be whole numbers in [0, {PER_EDGE}] (the edge's clients)"
    if case == "negative-label":
        return triple(labels=torch.cat([labels[:-1], torch.tensor([-1])])), f"labels must lie in [0, {NUM_CLASSES})"
    if case == "label-equals-J":
        return triple(labels=torch.cat([labels[:-1], torch.tensor([NUM_CLASSES])])),\
            f"labels must lie in [0, {NUM_CLASSES})"
    if case == "labels-shorter":
        return triple(labels=labels[:-1]), "tensor 'sample/labels' has shape [6], expected ['n=7']"
    if case == "above-the-cap":
        fragment = f"tensor 'sample/features' has shape [{MAX_ROWS + 1}, {DIM}], expected ['n<={MAX_ROWS}', {DIM}]"
        return triple(MAX_ROWS + 1), fragment
    if case == "negative-count":
        return triple(counts=torch.cat([counts[:-1], torch.tensor([-1.0], dtype=torch.float64)])), whole
    if case == "fractional-count":
        return triple(counts=torch.cat([counts[:-1], torch.tensor([0.5], dtype=torch.float64)])), whole
    if case == "count-above-clients":
        return triple(counts=torch.cat([counts[:-1], torch.tensor([PER_EDGE + 1.0], dtype=torch.float64)])),\
            whole
    if case == "huge-feature":
        return triple(features=torch.full((7, DIM), 1e20)), "tensor 'sample/features' has values beyond ±1e+06"
    if case == "nan-prototype":
        bad = prototypes.clone()
        bad[3, 4] = math.nan
        return triple(prototypes=bad), "tensor 'prototypes/means' contains NaN or Inf"
    if case == "wrong-d":
        return triple(prototypes=torch.zeros(NUM_CLASSES, DIM + 1, dtype=torch.float64)),\
            f"tensor 'prototypes/means' has shape [{NUM_CLASSES}, {DIM + 1}], expected [{NUM_CLASSES}, {DIM}]"
    if case == "float64-features":
        return triple(features=torch.zeros(7, DIM, dtype=torch.float64)),\
            "tensor 'sample/features' has dtype torch.float64, expected torch.float32"
    assert case == "missing-counts"
    return {k: v for k, v in triple().items() if k != WIRE["counts"]}, "missing ['prototypes/counts'], unexpected []"


BAD_CASES = ["negative-label", "label-equals-J", "labels-shorter", "above-the-cap", "negative-count",
             "fractional-count", "count-above-clients", "huge-feature", "nan-prototype", "wrong-d", "float64-features",
             "missing-counts"]


@pytest.mark.parametrize("case", BAD_CASES)
async def test_invalid_triple_refused(cloud: Cloud, case: str) -> None:
    run_id = await hfpl_run(cloud)
    tensors, fragment = _bad(case)
    before = await cloud.snapshot(run_id)
    r = await cloud.submit(0, message(run_id, 0, 0, tensors=tensors))
    detail_of(r, 422, fragment)
    assert await cloud.snapshot(run_id) == before
    await accepted(cloud, 0, message(run_id, 0, 0), buffered=1)  # the refusal took no slot


@pytest.mark.parametrize("ids", [[1], [99], [0, 3, 5]], ids=["other-edges-client", "unknown-client", "one-foreign"])
async def test_clients_must_be_clients_of_the_edge(cloud: Cloud, ids: list[int]) -> None:
    """The cloud files each client's report under its id (hfpl keeps the latest per client): a header
    naming another edge's client or an unknown one would corrupt that memory or crash the update.
    With 6 clients over 3 edges, edge 0 serves clients 0 and 3. (A client may appear once per edge
    round, so repeats are allowed.)"""
    run_id = await hfpl_run(cloud)
    clients = [ClientParticipation(client_id=k, num_samples=10, loss=0.5, metrics={"accuracy": 0.5})
               for k in ids]
    header = contribution_header(run_id, edge_id=0, base_version=0, key=None, clients=clients)
    before = await cloud.snapshot(run_id)
    r = await cloud.submit(0, encode(triple(), header))
    detail_of(r, 422, "clients must be clients of edge 0")
    assert await cloud.snapshot(run_id) == before
