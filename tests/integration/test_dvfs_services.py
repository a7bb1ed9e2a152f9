"""DVFS through the services, emulated: 2 edges × 2 clients with heterogeneous device profiles (edge 0 holds
the fast ones), FedAvg, synchronous. Each policy trains the same model as the reference runner; the history
carries each client's frequencies, modelled time and energy; deadline and slack spend less than max."""
import itertools
import os
import subprocess
import sys

import pytest

from fl_services.fedctl.launch import ROOT
from fl_services.shared.core.config import RunConfig
from fl_services.shared.core.reference import run_reference
from fl_services.shared.core.reports import RoundRecord, RunStatus
from tests.federation.checks import assert_same_model
from tests.integration.topology import federation

pytestmark = pytest.mark.slow

SCALE = 0.3  # a modelled second is 0.3 s of wall time: well above the real computation's share
# Clients k ≡ e (mod 2) belong to edge e: edge 0 gets rpi4 and odroid-xu4-a15, edge 1 the A7 and the Zero 2 W.
PROFILES = ["rpi4", "odroid-xu4-a7", "odroid-xu4-a15", "rpi-zero-2w"]


def config(policy: str) -> RunConfig:
    return RunConfig(name=f"dvfs-{policy}", rounds=5, model={"name": "mlp"},
                     data={"dataset": "digits", "num_clients": 4}, local={"epochs": 2, "batch_size": 16, "lr": 0.1},
                     topology={"num_edges": 2, "buffer_size": 2},
                     dvfs={"policy": policy, "profiles": PROFILES, "time_scale": SCALE})


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    # Emulation is asked for explicitly: a host with writable cpufreq would otherwise be driven for real.
    with federation(tmp_path_factory, num_clients=4, num_edges=2, procs_per_edge=1,
                    extra_env={"FL_CLIENT_DVFS_BACKEND": "emulate"}) as (topology, api):
        done = {}
        for policy in ("max", "deadline", "slack"):
            cfg = config(policy)
            run_id = api.create_run(cfg).run_id
            api.action(run_id, "start")
            final = api.wait(run_id, timeout_s=300)
            assert final.status == RunStatus.finished
            done[policy] = (run_id, api.history(run_id), api.model(run_id))
        done["topology"] = topology
        yield done


POLICIES = ("max", "deadline", "slack")


def energy(history: list[RoundRecord]) -> float:
    return sum(h.energy_j for h in history)


def test_every_policy_trains_the_reference_model(runs):
    reference = run_reference(config("max"))
    for _, _, model in (runs[p] for p in POLICIES):
        assert_same_model(model, reference.global_state)  # DVFS changes the timing, never the maths


def test_the_history_carries_each_clients_device_and_the_rounds_energy(runs):
    for policy, (_, history, _) in ((p, runs[p]) for p in POLICIES):
        for h in history:
            assert len(h.clients) == 4
            assert h.energy_j == pytest.approx(sum(c.device.energy_j for c in h.clients if c.device))
            for c in h.clients:
                assert c.device is not None and c.device.backend == "emulated" and c.device.policy == policy
                assert c.device.profile == PROFILES[c.client_id] and len(c.device.frequencies_ghz) == 2
                assert c.device.energy_j > 0 and c.device.compute_s > 0 and c.device.comm_s > 0
    _, history, _ = runs["max"]
    top = {"rpi4": 1.5, "odroid-xu4-a7": 1.4, "odroid-xu4-a15": 2.0, "rpi-zero-2w": 1.0}
    assert all(c.device.frequencies_ghz == [top[c.device.profile]] * 2 for h in history for c in h.clients)


def test_deadline_slows_the_fast_clients_of_an_edge_to_its_slowest(runs):
    _, history, _ = runs["deadline"]
    assert all(c.device.budget_s is None for c in history[0].clients)  # nobody had reported: full speed
    for h in history[1:]:
        for edge in (0, 1):
            clients = [c for c in h.clients if c.edge_id == edge]
            deadline = max(c.device.full_speed_s for c in clients)
            slowest = max(clients, key=lambda c: c.device.full_speed_s)
            assert slowest.device.frequencies_ghz[0] == max(slowest.device.frequencies_ghz)
            for c in clients:
                assert c.device.budget_s == pytest.approx(deadline)
                assert c.device.compute_s + c.device.comm_s <= deadline * (1 + 1e-6)
    assert energy(history) < energy(runs["max"][1])


def test_slack_slows_the_edge_that_is_not_on_the_critical_path(runs):
    _, history, _ = runs["slack"]
    _, deadline_history, _ = runs["deadline"]
    later = history[2:]  # the wait is heard from version 1 on, and used from the next round
    fast_edge = [c for h in later for c in h.clients if c.edge_id == 0]
    own_deadline = max(c.device.full_speed_s for c in fast_edge)
    assert all(c.device.budget_s > 2 * own_deadline for c in fast_edge)  # edge 1 is about 3× slower
    assert energy(history) < energy(deadline_history) < energy(runs["max"][1])
    # Emulated: a round's wall time covers its slowest client's modelled time × the scale.
    for previous, h in itertools.pairwise(history):
        slowest = max(c.device.compute_s + c.device.comm_s for c in h.clients)
        assert (h.finished_at - previous.finished_at).total_seconds() >= slowest * SCALE


def test_fedctl_results_prints_each_updates_energy_and_the_running_total(runs):
    topology = runs["topology"]
    run_id, history, _ = runs["deadline"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    out = subprocess.run([sys.executable, "-m", "fl_services.fedctl", "results", run_id, "--cloud", topology.cloud_url,
                          "--token", topology.admin_token], env=env, cwd=ROOT, capture_output=True, text=True,
                         timeout=60, check=True).stdout
    assert "dvfs deadline" in out
    assert "energy J" in out and "total J" in out
    rows = [line.split() for line in out.splitlines()]
    printed = [(int(r[0]), r[7], r[8]) for r in rows if len(r) == 9 and r[0].isdigit()]
    total, expected = 0.0, []
    for h in history:
        total += h.energy_j
        expected.append((h.version, f"{h.energy_j:.1f}", f"{total:.1f}"))
    assert printed == expected
