"""A client process holding a token per logical client (as `fedctl issue-token --out` writes them) and not the
edges' client secret runs a federation; revoking one token stops that client alone. (The fedctl commands
themselves, over real HTTP: tests/integration/test_operations_services.py.)"""
import asyncio
import time

import pytest

from fl_services.shared.core.config import RunConfig
from fl_services.shared.core.reports import RunStatus
from fl_services.shared.wire.admin import Revocation
from fl_services.shared.wire.protocol import issue_device_tokens
from tests.federation.checks import assert_same_model, reference
from tests.federation.harness import CLIENT_TOKEN, Admin, federation

pytestmark = pytest.mark.anyio


def own_tokens(ids: list[int]) -> dict:
    """A worker's settings: a device token per hosted client, and a client secret the edges do not accept. Its
    task poll lasts 2 s: a refusal is heard in the answer to the poll after the revocation reached the edge."""
    return {"client_tokens": issue_device_tokens(CLIENT_TOKEN, ids), "client_token": "not-the-edges-secret",
            "long_poll_s": 2.0}


async def finished_run(admin: Admin, config: RunConfig) -> tuple[str, list[list[int]]]:
    run_id = (await admin.create_run(config)).run_id
    await admin.action(run_id, "start")
    assert (await admin.wait(run_id)).status == RunStatus.finished
    return run_id, [sorted(c.client_id for c in record.clients) for record in await admin.history(run_id)]


async def test_a_process_with_a_token_per_client_runs_and_a_revoked_token_stops_that_client_alone(cloud_storage,
                                                                                                  tmp_path):
    """One client worker hosts clients 0, 1 and 2, each with its own issued token: a run through the services
    equals the reference. Revoking client 1's token stops client 1 alone: the worker goes on, and the next run
    finishes with clients 0 and 2 at its deadline."""
    config = RunConfig(name="tokens", model={"name": "logreg"}, rounds=2, local={"lr": 0.1},
                       data={"dataset": "digits", "num_clients": 3}, policy={"deadline_s": 4, "min_fraction": 0.6})
    async with federation(cloud_storage, tmp_path, num_clients=3, procs_per_edge=1, client=own_tokens,
                          edge={"revocation_refresh_s": 0.5}) as fed:
        [process] = fed.clients
        run_id, answered = await finished_run(fed.admin, config)
        assert answered == [[0, 1, 2]] * config.rounds
        assert_same_model(await fed.admin.model(run_id), (await reference(config)).global_state)

        token_id = process.settings.client_tokens[1].split(".")[2]
        revoked = await fed.admin.http.post("/api/v1/tokens/revoked",
                                            content=Revocation(token_id=token_id).model_dump_json(),
                                            headers={"Content-Type": "application/json"})
        assert revoked.status_code < 300, revoked.text
        deadline = time.monotonic() + 30
        while 1 not in process.worker.stopped:
            assert time.monotonic() < deadline, "client 1 still serves with its revoked token"
            await asyncio.sleep(0.05)
        # One round shows it: each round without client 1 lasts the whole deadline.
        _, answered = await finished_run(fed.admin, config.model_copy(update={"rounds": 1}))
        assert answered == [[0, 2]]
        assert process.alive()
        assert "revoked" in process.worker.stopped[1] and set(process.worker.stopped) == {1}
