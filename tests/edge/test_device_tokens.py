"""Per-device tokens: one issued with an id acts for its client alone, and the edge refuses it once the cloud
lists its id as revoked (as it refuses a derived token by its id client-<k>), while every other device and the
edge's secret keep working."""
from __future__ import annotations

import httpx
import pytest

from fl_services.edge.revocations import Revocations
from fl_services.shared.wire.protocol import (
    client_token,
    device_token,
    device_token_grant,
    device_token_id,
    issue_device_tokens,
    issued_token_parts,
)
from tests.edge.harness import CLIENT_TOKEN, Edge, auth, running_edge
from tests.prometheus import samples, value
from tests.web import detail_of

pytestmark = pytest.mark.anyio


def test_a_device_token_names_its_client_and_id() -> None:
    token = device_token("s3cret", 4, "0123abcd4567")
    assert device_token_id("s3cret", token, 4) == "0123abcd4567"
    assert device_token_id("s3cret", token, 5) is None  # another client
    assert device_token_id("other", token, 4) is None  # another edge secret
    forged = token.replace("0123abcd4567", "0123abcd4568")  # another id, the same mac
    assert device_token_id("s3cret", forged, 4) is None
    assert device_token_id("s3cret", client_token("s3cret", 4), 4) == "client-4"
    assert device_token_id("s3cret", "fl1.4", 4) is None
    # Made with the secret, but with an id the revocation API refuses: such a token could never be revoked.
    for unrevocable in ("", "short", "x" * 65, "a+b/c=d=e"):
        assert device_token_id("s3cret", device_token("s3cret", 4, unrevocable), 4) is None, unrevocable


async def register(edge: Edge, client_id: int, token: str) -> httpx.Response:
    return await edge.http.post("/api/v1/clients", json={"client_id": client_id}, headers=auth(token))


async def test_the_edge_refuses_a_revoked_device_token_only(edge: Edge) -> None:
    mine, yours = device_token(CLIENT_TOKEN, 1, "aaaabbbbcccc"), device_token(CLIENT_TOKEN, 1, "ddddeeeeffff")
    derived = client_token(CLIENT_TOKEN, 2)
    for client_id, token in ((1, mine), (1, yours), (2, derived), (3, CLIENT_TOKEN)):
        assert (await register(edge, client_id, token)).status_code == 200
    detail_of(await register(edge, 2, mine), 401)  # client 1's token only
    revocations: Revocations = edge.app.state.revocations

    async def listed(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/api/v1/edges/revoked-tokens"
        return httpx.Response(200, json=["aaaabbbbcccc", "client-2"])

    async with httpx.AsyncClient(transport=httpx.MockTransport(listed), base_url="http://cloud") as cloud:
        await revocations.refresh(cloud)
    detail_of(await register(edge, 1, mine), 401, "aaaabbbbcccc", "revoked")
    detail_of(await register(edge, 2, derived), 401, "client-2", "revoked")
    r = await edge.http.get("/api/v1/clients/1/task", params={"timeout": 0}, headers=auth(mine))
    detail_of(r, 401, "revoked")
    assert (await register(edge, 1, yours)).status_code == 200
    assert (await register(edge, 2, CLIENT_TOKEN)).status_code == 200  # the secret is not a device's


async def test_a_device_whose_token_is_revoked_is_no_runs_member(edge: Edge) -> None:
    """Its registration stays (its token is refused from then on), but no round selects it any more."""
    tokens = {1: device_token(CLIENT_TOKEN, 1, "aaaabbbbcccc"), 2: client_token(CLIENT_TOKEN, 2), 3: CLIENT_TOKEN}
    for client_id, token in tokens.items():
        assert (await register(edge, client_id, token)).status_code == 200
    assert sorted(edge.board.devices(frozenset())) == [1, 2, 3]
    assert sorted(edge.board.devices(frozenset({"aaaabbbbcccc"}))) == [2, 3]
    assert sorted(edge.board.devices(frozenset({"client-2", "aaaabbbbcccc"}))) == [3]
    assert (await register(edge, 1, device_token(CLIENT_TOKEN, 1, "ddddeeeeffff"))).status_code == 200
    assert sorted(edge.board.devices(frozenset({"aaaabbbbcccc"}))) == [1, 2, 3]  # registered again, with another


def test_a_site_bound_token_names_its_site_and_cannot_be_moved() -> None:
    bound = device_token("s3cret", 4, "0123abcd4567", site="clinic-a.eu")
    assert bound.endswith("~clinic-a.eu")
    assert device_token_grant("s3cret", bound, 4) == ("0123abcd4567", "clinic-a.eu")
    assert device_token_id("s3cret", bound, 4) == "0123abcd4567"
    assert issued_token_parts(bound) == (4, "0123abcd4567")
    # The site is under the mac: renamed, dropped or emptied, the token is no token.
    for moved in (bound.replace("clinic-a.eu", "clinic-b"), bound.partition("~")[0], bound.partition("~")[0] + "~"):
        assert device_token_grant("s3cret", moved, 4) is None, moved
    unbound = device_token("s3cret", 4, "0123abcd4567")
    assert device_token_grant("s3cret", unbound, 4) == ("0123abcd4567", None)
    assert device_token_grant("s3cret", unbound + "~clinic-a.eu", 4) is None
    assert all(t.endswith("~x") for t in issue_device_tokens("s3cret", [1, 2], site="x").values())


async def test_a_token_bound_to_another_site_is_refused_with_403_and_counted() -> None:
    async with running_edge(name="clinic-b") as edge:
        here, there = (device_token(CLIENT_TOKEN, 1, "aaaabbbbcccc", site="clinic-b"),
                       device_token(CLIENT_TOKEN, 2, "ddddeeeeffff", site="clinic-a"))
        assert (await register(edge, 1, here)).status_code == 200
        detail_of(await register(edge, 2, there), 403, "may join site 'clinic-a' only", "this edge is site 'clinic-b'")
        assert 2 not in edge.board.clients
        r = await edge.http.get("/api/v1/clients/2/task", params={"timeout": 0}, headers=auth(there))
        detail_of(r, 403, "clinic-a")
        detail_of(await register(edge, 1, there), 401)  # client 2's token, whatever its site
        scraped = samples((await edge.http.get("/metrics")).text)
        assert value(scraped, "fl_edge_device_tokens_refused_total", reason="other_site") == 2
        assert value(scraped, "fl_edge_device_tokens_refused_total", reason="invalid") == 1
        assert value(scraped, "fl_edge_device_tokens_refused_total", reason="revoked") == 0


async def test_a_device_token_on_the_device_registry_is_forbidden_saying_why(edge: Edge) -> None:
    """The registry is the operator's: a device's own token is a credential without that right (403), a token
    that is none, or a revoked one, is no credential (401)."""
    issued, derived = device_token(CLIENT_TOKEN, 1, "aaaabbbbcccc"), client_token(CLIENT_TOKEN, 2)
    for client_id, token in ((1, issued), (2, derived)):
        assert (await register(edge, client_id, token)).status_code == 200
    for client_id, token in ((1, issued), (2, derived)):
        r = await edge.http.get("/api/v1/devices", headers=auth(token))
        detail_of(r, 403, f"client {client_id}'s", "operator", "client secret")
    for wrong in ("not-a-token", device_token("other-secret", 1, "aaaabbbbcccc"), client_token("other-secret", 2)):
        detail_of(await edge.http.get("/api/v1/devices", headers=auth(wrong)), 401)

    async def listed(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json=["aaaabbbbcccc"])

    async with httpx.AsyncClient(transport=httpx.MockTransport(listed), base_url="http://cloud") as cloud:
        await edge.app.state.revocations.refresh(cloud)
    detail_of(await edge.http.get("/api/v1/devices", headers=auth(issued)), 401)  # revoked: no credential now
    r = await edge.http.get("/api/v1/devices", headers=auth(CLIENT_TOKEN))
    assert r.status_code == 200 and [d["client_id"] for d in r.json()] == [1, 2]


@pytest.mark.parametrize("body", [b"{not json", b"[1]", b"{}", b'{"client_id": "1"}', b'{"client_id": 1, "x": 1}'],
                         ids=["not-json", "array", "empty", "string-id", "extra"])
async def test_an_issued_token_with_a_bad_registration_is_told_what_is_wrong_with_the_body(edge: Edge,
                                                                                           body: bytes) -> None:
    """The token names its client and is genuine: its holder's mistake is the body (422), not the token."""
    before = await edge.snapshot()
    r = await edge.http.post("/api/v1/clients", content=body, headers={
        **auth(device_token(CLIENT_TOKEN, 1, "aaaabbbbcccc")), "Content-Type": "application/json"})
    assert r.status_code == 422, r.text
    assert await edge.snapshot() == before
    # A token of another secret, even one naming a client, is still refused as a token.
    r = await edge.http.post("/api/v1/clients", content=body, headers={
        **auth(device_token("another secret", 1, "aaaabbbbcccc")), "Content-Type": "application/json"})
    assert detail_of(r, 401) == "invalid bearer token"


async def test_an_issued_token_acting_for_another_client_is_told_which_it_acts_for(edge: Edge) -> None:
    mine = device_token(CLIENT_TOKEN, 1, "aaaabbbbcccc")
    assert (await register(edge, 1, mine)).status_code == 200
    await edge.open_tasks(2)
    before = await edge.snapshot(1, 2)
    detail_of(await register(edge, 2, mine), 401, "acts for client 1 only, not client 2")
    r = await edge.http.get("/api/v1/clients/2/task", params={"timeout": 0}, headers=auth(mine))
    detail_of(r, 401, "acts for client 1 only, not client 2")
    r = await edge.http.post("/api/v1/clients/tasks", json={"client_ids": [2], "timeout": 0}, headers=auth(mine))
    detail_of(r, 401, "acts for client 1 only, not client 2")
    assert await edge.snapshot(1, 2) == before
    # A forged one (another secret's) says nothing of whom it would act for.
    forged = device_token("another secret", 1, "aaaabbbbcccc")
    assert detail_of(await register(edge, 2, forged), 401) == "invalid bearer token"
