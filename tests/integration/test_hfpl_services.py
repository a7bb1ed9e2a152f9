"""Prototype learning over real processes: 3 edges × 4 clients, three model families, a Redis buffer of B = 2,
one edge 3× slower, and a cloud or an edge killed mid-run (SIGKILL). What needs no process (the levers, the
one-edge B = 1 case): tests/federation/test_hfpl.py."""
import signal
import time

import pytest
import redis
import torch

from fl_services.cloud.storage.redis import Keys
from fl_services.shared.core.config import RunConfig
from fl_services.shared.core.reference import run_reference, schedule_of
from fl_services.shared.core.reports import EdgeContributionHeader, RoundRecord, RunStatus
from tests.integration.topology import federation

pytestmark = pytest.mark.slow

SLOW_EDGE = 2
# digits keeps rounds short; 12 clients give each edge four, with families mlp, cnn, cnn_deep, mlp.
CONFIG = dict(algorithm="hfpl", seed=3,
              data={"dataset": "digits", "partition": "dirichlet", "alpha": 0.3, "num_clients": 12},
              local={"epochs": 1, "batch_size": 32, "lr": 0.05},
              params={"proto_weight": 0.05, "feature_dim": 32, "feature_cap": 40})


@pytest.fixture(scope="module")
def three_edges(tmp_path_factory):
    with federation(tmp_path_factory, num_clients=12, num_edges=3, procs_per_edge=1,
                    edge_env={SLOW_EDGE: {"FL_EDGE_SLOWDOWN": "3"}}) as topology_and_api:
        yield topology_and_api


def buffered_triples(topology, run_id: str) -> list[tuple[int, int]]:
    """(edge, base_version) of the triples in the run's Redis buffer, oldest first."""
    r = redis.Redis.from_url(topology.redis_url)
    try:
        entries = r.xrange(Keys(topology.key_prefix).buffer(run_id))
    finally:
        r.close()
    headers = [EdgeContributionHeader.model_validate_json(fields[b"header"]) for _, fields in entries]
    return [(h.edge_id, h.base_version) for h in headers]


def accepted_keys(topology, run_id: str) -> set[str]:
    r = redis.Redis.from_url(topology.redis_url)
    try:
        return {k.decode() for k in r.hkeys(Keys(topology.key_prefix).idempotency(run_id))}
    finally:
        r.close()


def run_with_a_cloud_kill(topology, api, config: RunConfig, slow_edge: int) -> tuple[str, list[RoundRecord]]:
    """Runs `config`, killing the cloud (SIGKILL) after version 4 while a stale contribution of `slow_edge` waits
    in the buffer; checks that every accepted contribution was consumed exactly once or still waits (none twice,
    none lost), those buffered at the kill included. The run's id and history.
    The run is paused while the buffer is looked at: on a loaded machine the fast edges can otherwise finish
    the run before the slow one submits once, and nothing here could be said about it."""
    run_id = api.create_run(config).run_id
    api.action(run_id, "start")
    deadline = time.monotonic() + 180
    while True:
        assert time.monotonic() < deadline, f"edge {slow_edge} never had a stale contribution waiting"
        info = api.run(run_id)
        assert info.status in (RunStatus.waiting, RunStatus.running), f"the run is {info.status.value} before the kill"
        if info.version >= 4:
            api.action(run_id, "pause")
            version = api.run(run_id).version
            # Paused, no version comes: the slow edge submits the round it trains (on a version ≤ this one).
            while True:
                before_kill = buffered_triples(topology, run_id)
                if mine := [b for e, b in before_kill if e == slow_edge]:
                    break
                assert time.monotonic() < deadline, f"edge {slow_edge} submitted nothing while the run was paused"
                time.sleep(0.05)
            if min(mine) < version:
                break
            api.action(run_id, "resume")  # its contribution is on the newest version: let it go, try later
        time.sleep(0.05)
    topology.restart_cloud(signal.SIGKILL)
    api.action(run_id, "resume")

    final = api.wait(run_id, timeout_s=300)
    assert final.status == RunStatus.finished and final.version == config.rounds
    history = api.history(run_id)
    assert [h.version for h in history] == list(range(1, config.rounds + 1))
    # The edges' contributions (late answers that joined one are parts of it, policy.late = 'join').
    consumed = [(c.edge_id, c.base_version) for h in history for c in h.contributions if not c.joined]
    left = buffered_triples(topology, run_id)
    assert len(consumed) == len(set(consumed)) == config.topology.buffer_size * config.rounds
    assert not set(consumed) & set(left)
    assert accepted_keys(topology, run_id) == {f"{run_id}:{e}:{v}" for e, v in consumed + left}
    assert set(before_kill) <= set(consumed)
    return run_id, history


def test_async_buffer_consumes_every_triple_once_across_a_cloud_crash(three_edges):
    topology, api = three_edges
    config = RunConfig(name="hfpl-async", rounds=14, topology={"num_edges": 3, "buffer_size": 2}, **CONFIG)
    run_id, history = run_with_a_cloud_kill(topology, api, config, SLOW_EDGE)

    # Each update took the first B = 2 arrivals: two distinct edges, in varying combinations.
    buffers = [tuple(sorted(c.edge_id for c in h.contributions)) for h in history]
    assert all(len(set(b)) == 2 for b in buffers)
    assert len(set(buffers)) >= 2
    # The slow edge is consumed less often, with stale triples; staleness = version − base_version.
    slow = [c for h in history for c in h.contributions if c.edge_id == SLOW_EDGE]
    assert 0 < len(slow) < config.rounds * 2 / 3
    assert max(c.staleness for c in slow) >= 1
    for h in history:
        assert all(c.staleness == h.round - c.base_version for c in h.contributions)

    # Clients of all three families evaluated themselves on their held-out splits.
    reported = {c.client_id for h in history for c in h.clients if "accuracy" in c.metrics}
    assert reported == set(range(12))

    # Replaying the same buffers in process gives the same global prototypes and classifier.
    reference = run_reference(config, schedule=schedule_of(history))
    model = api.model(run_id)
    for name, value in reference.global_state.items():
        assert torch.allclose(model[name].to(value.dtype), value, atol=1e-4), name


def test_a_killed_edge_restarts_with_its_client_memory(three_edges):
    """An edge keeps every client's last prototype and features on disk: killed and started again, it
    continues the same incremental means, so the run still equals the replayed reference. (A kill that
    cuts a round also loses nothing, but the clients' extractors advanced in a round that was never
    submitted, so a replay of the consumed buffers could not reproduce it.)"""
    topology, api = three_edges
    # Half of each edge's clients per round: a client that sits out after the restart is only in the
    # edge's means through the memory on disk (with everyone every round, a forgetful edge would
    # rebuild the same means in one round and this test could not fail).
    # 25 rounds: the pause/resume probe below lets a few updates through each time it misses edge 0, and
    # with 10 rounds a loaded machine could see the run finish before edge 0 had a triple waiting.
    config = RunConfig(name="hfpl-edge-crash", rounds=25, fraction=0.5,
                       topology={"num_edges": 3, "buffer_size": 2}, **CONFIG)
    run_id = api.create_run(config).run_id
    api.action(run_id, "start")
    # Kill edge 0 while it waits for its buffered triple to be consumed: idle, with its memory only on
    # disk. Paused first, so that no new state reaches it and edges 1 and 2 do not finish the run
    # alone while it is down (rounds on digits take a fraction of a second).
    deadline = time.monotonic() + 180
    while True:
        assert time.monotonic() < deadline, "edge 0 never had a triple waiting after version 3"
        if api.run(run_id).version >= 3:
            api.action(run_id, "pause")
            if any(edge == 0 for edge, _ in buffered_triples(topology, run_id)):
                break
            api.action(run_id, "resume")
        time.sleep(0.05)
    topology.restart_edge(0, signal.SIGKILL)
    topology.wait_registered()
    resumed_at = api.run(run_id).version
    api.action(run_id, "resume")
    final = api.wait(run_id, timeout_s=300)
    assert final.status == RunStatus.finished and final.version == config.rounds
    history = api.history(run_id)
    assert any(c.edge_id == 0 and c.base_version >= resumed_at for h in history for c in h.contributions)
    reference = run_reference(config, schedule=schedule_of(history))
    model = api.model(run_id)
    for name, value in reference.global_state.items():
        assert torch.allclose(model[name].to(value.dtype), value, atol=1e-4), name


LEVERS = {"momentum": 0.5, "proto_distance": "mean", "proto_weight": 1.0, "inference": "nearest_prototype",
          "own_classes": True, "staleness": "fedbuff"}


# Either G other than the default: the cosine one, or the mlp one, whose hidden layer travels in the task.
@pytest.mark.parametrize("classifier", [{"classifier": "cosine", "classifier_scale": 8.0},
                                        {"classifier": "mlp", "classifier_width": 16}], ids=["cosine", "mlp"])
def test_the_levers_travel_through_the_services_and_equal_the_reference(three_edges, classifier):
    """Every lever of docs/benchmarks/fedproto-protocol.md set at once, asynchronously: the services' model and
    every client's reported figures equal the in-process reference replaying the same buffers, and differ from
    the run without the levers. Over processes: in the federation tier's one process this run once differed
    from the reference under load, a cause not yet found (docs/how-to-run-the-tests.md)."""
    topology, api = three_edges
    # 14 updates, as in the crash test above: enough for the slow edge's triples to be consumed stale.
    config = RunConfig(name="hfpl-levers", rounds=14, topology={"num_edges": 3, "buffer_size": 2},
                       **{**CONFIG, "params": {**CONFIG["params"], **LEVERS, **classifier}})
    run_id = api.create_run(config).run_id
    api.action(run_id, "start")
    final = api.wait(run_id, timeout_s=300)
    assert final.status == RunStatus.finished
    history = api.history(run_id)
    # The slow edge's triples usually arrive stale (the crash test above asserts it); on a loaded machine the
    # arrival order can differ, so the staleness rule is checked by hand in test_hfpl.py, and here only
    # through the equality whatever the schedule.
    schedule = schedule_of(history)
    reference = run_reference(config, schedule=schedule)
    model = api.model(run_id)
    assert model.keys() == reference.global_state.keys()  # the mlp G's hidden layer too
    for name, value in reference.global_state.items():
        assert torch.allclose(model[name].to(value.dtype), value, atol=1e-4), name
    for got, want in zip(history, reference.history, strict=True):
        assert [c.client_id for c in got.clients] == [c.client_id for c in want.clients]
        for mine, theirs in zip(got.clients, want.clients, strict=True):
            assert mine.metrics == pytest.approx(theirs.metrics, abs=1e-6)
            # Nearest-prototype inference: once C̄ exists, the reported accuracy is that rule's.
            assert "proto_accuracy" not in mine.metrics or mine.metrics["accuracy"] == mine.metrics["proto_accuracy"]
    plain = run_reference(config.model_copy(update={"params": CONFIG["params"]}), schedule=schedule)
    assert not torch.allclose(plain.global_state["prototypes"], reference.global_state["prototypes"])
