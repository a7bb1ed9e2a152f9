"""Clients on another host: client processes in their own network namespace, joined to the edge's by a
veth pair, as a device behind a home router is joined to the internet; then the link is cut mid-run.

Needs root and iproute2 (CI has both); skipped where a network namespace cannot be made.
"""
from __future__ import annotations

import os
import random
import secrets
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from fl_services.fedctl.api import CloudAPI
from fl_services.fedctl.launch import LocalTopology
from fl_services.shared.core.config import RunConfig
from fl_services.shared.core.reference import run_reference
from fl_services.shared.core.reports import RunStatus
from tests.federation.checks import assert_same_model

pytestmark = pytest.mark.slow


@dataclass(frozen=True)
class Host:
    """A network namespace: its name, the address the edges listen on from its point of view, and the
    edge side of the link (down = cable pulled)."""

    namespace: str
    edge_address: str
    link: str

    def exec_prefix(self) -> list[str]:
        return ["ip", "netns", "exec", self.namespace]

    def set_link(self, up: bool) -> None:
        _ip("link", "set", self.link, "up" if up else "down")

    def pids(self) -> set[int]:
        out = subprocess.run(["ip", "netns", "pids", self.namespace], capture_output=True, text=True, check=True)
        return {int(p) for p in out.stdout.split()}

    def listening_sockets(self) -> str:
        out = subprocess.run([*self.exec_prefix(), "ss", "-Hltn"], capture_output=True, text=True, check=True)
        return out.stdout.strip()


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


@pytest.fixture
def client_host() -> Iterator[Host]:
    if os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("ss") is None:
        pytest.skip("network namespaces need root and iproute2")
    tag = f"{os.getpid() % 10_000}{random.randrange(100)}"
    namespace, edge_side, client_side = f"flc{tag}", f"fle{tag}", f"flk{tag}"
    subnet = f"10.{random.randrange(64, 128)}.{random.randrange(256)}"
    try:
        _ip("netns", "add", namespace)
    except subprocess.CalledProcessError as exc:
        pytest.skip(f"cannot create a network namespace here: {exc.stderr.decode().strip()}")
    try:
        _ip("link", "add", edge_side, "type", "veth", "peer", "name", client_side)
        _ip("link", "set", client_side, "netns", namespace)
        _ip("addr", "add", f"{subnet}.1/24", "dev", edge_side)
        _ip("link", "set", edge_side, "up")
        for args in (("addr", "add", f"{subnet}.2/24", "dev", client_side), ("link", "set", client_side, "up"),
                     ("link", "set", "lo", "up")):
            _ip("netns", "exec", namespace, "ip", *args)
        yield Host(namespace, f"{subnet}.1", edge_side)
    finally:
        subprocess.run(["ip", "netns", "del", namespace], capture_output=True)  # takes the veth pair along
        subprocess.run(["ip", "link", "del", edge_side], capture_output=True)


def test_clients_on_another_host_survive_a_cut_link_and_give_the_reference_model(client_host, tmp_path):
    # A long deadline: the cut must delay the round, not drop anyone, so the model equals the reference.
    config = RunConfig(name="remote", model={"name": "logreg"}, rounds=8, data={"dataset": "digits", "num_clients": 4},
                       local={"lr": 0.1}, policy={"deadline_s": 120})
    with LocalTopology(num_clients=4, procs_per_edge=2, workdir=tmp_path, redis_url=os.environ.get("REDIS_URL"),
                       edge_host=client_host.edge_address, client_prefix=client_host.exec_prefix(),
                       # beyond loopback, an edge refuses the built-in development token
                       client_token=secrets.token_hex(16)) as topo,\
            CloudAPI(topo.cloud_url, topo.admin_token) as api:
        assert {c.proc.pid for c in topo.clients} <= client_host.pids()  # the clients run over there
        info = api.create_run(config)
        api.action(info.run_id, "start")
        deadline = time.monotonic() + 120
        while api.run(info.run_id).version < 2:
            assert time.monotonic() < deadline, "the run did not reach version 2"
            time.sleep(0.05)
        # Paused while the link is cut, so that however fast or loaded the machine, rounds remain for the cut to
        # hold up (a pause holds the version); resumed with the link still cut.
        api.action(info.run_id, "pause")
        client_host.set_link(False)
        cut_at = api.run(info.run_id).version
        api.action(info.run_id, "resume")
        time.sleep(5)  # several long-poll and upload attempts fail meanwhile
        stalled = api.run(info.run_id).version
        client_host.set_link(True)
        final = api.wait(info.run_id, timeout_s=300)
        history, model = api.history(info.run_id), api.model(info.run_id)
        # Clients only dial out: nothing listens on their host (a NAT would let nothing in anyway).
        assert client_host.listening_sockets() == ""
        assert all(c.alive() for c in topo.clients)

    assert final.status == RunStatus.finished and final.version == config.rounds
    assert stalled <= cut_at + 1 < config.rounds, (cut_at, stalled)  # at most the round in flight got through
    assert all(sorted(c.client_id for c in h.clients) == [0, 1, 2, 3] for h in history)
    assert_same_model(model, run_reference(config).global_state)
