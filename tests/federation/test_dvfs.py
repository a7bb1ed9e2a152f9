"""DVFS through the services, emulated: 2 edges × 2 clients with heterogeneous device profiles (edge 0 holds
the fast ones), FedAvg, synchronous. Each policy trains the same model as the reference runner; the history
carries each client's frequencies, modelled time and energy; deadline and slack spend less than max."""
import asyncio
import itertools

import pytest
from rich.console import Console
from typer.testing import CliRunner

from fl_services.fedctl import __main__ as fedctl
from fl_services.fedctl import display
from fl_services.fedctl.api import CloudAPI
from fl_services.shared.core.config import RunConfig
from fl_services.shared.core.reference import run_reference
from fl_services.shared.core.reports import RoundRecord, RunStatus
from fl_services.shared.core.tensors import Tensors
from tests.federation.checks import assert_same_model
from tests.federation.harness import ADMIN_TOKEN, CLOUD_URL, Federation, federation

SCALE = 0.3  # a modelled second is 0.3 s of wall time: well above the real computation's share
# Clients k ≡ e (mod 2) belong to edge e: edge 0 gets rpi4 and odroid-xu4-a15, edge 1 the A7 and the Zero 2 W.
PROFILES = ["rpi4", "odroid-xu4-a7", "odroid-xu4-a15", "rpi-zero-2w"]


def config(policy: str) -> RunConfig:
    return RunConfig(name=f"dvfs-{policy}", rounds=5, model={"name": "mlp"},
                     data={"dataset": "digits", "num_clients": 4}, local={"epochs": 2, "batch_size": 16, "lr": 0.1},
                     topology={"num_edges": 2, "buffer_size": 2},
                     dvfs={"policy": policy, "profiles": PROFILES, "time_scale": SCALE})


POLICIES = ("max", "deadline", "slack")


async def run_policies(fed: Federation, monkeypatch: pytest.MonkeyPatch) -> dict:
    """Each policy's run (id, history, model), the three at once, and what `fedctl results` printed for the
    deadline one. At once: the emulated devices' waits, not the computation, set each run's pace."""
    async def run(policy: str) -> tuple[str, list[RoundRecord], Tensors]:
        run_id = (await fed.admin.create_run(config(policy))).run_id
        await fed.admin.action(run_id, "start")
        assert (await fed.admin.wait(run_id)).status == RunStatus.finished
        return run_id, await fed.admin.history(run_id), await fed.admin.model(run_id)

    done: dict = dict(zip(POLICIES, await asyncio.gather(*map(run, POLICIES)), strict=True))
    # The CLI in a thread beside the loop, its REST client reaching the in-loop cloud.
    bridge = fed.cloud_bridge()
    monkeypatch.setattr(fedctl, "cloud_api", lambda cloud, token: CloudAPI(cloud, token, transport=bridge))
    monkeypatch.setattr(display, "console", Console(width=200))
    printed = await asyncio.to_thread(CliRunner().invoke, fedctl.app, ["results", done["deadline"][0], "--cloud",
                                                                      CLOUD_URL, "--token", ADMIN_TOKEN])
    assert printed.exit_code == 0, printed.output
    done["results"] = printed.output
    return done


@pytest.fixture(scope="module")
def runs(new_cloud_storage, tmp_path_factory):
    # Emulation is asked for explicitly: a host with writable cpufreq would otherwise be driven for real.
    async def main() -> dict:
        with pytest.MonkeyPatch.context() as monkeypatch:
            async with federation(new_cloud_storage(), tmp_path_factory.mktemp("dvfs"), num_clients=4, num_edges=2,
                                  procs_per_edge=1, client={"dvfs_backend": "emulate"}) as fed:
                return await run_policies(fed, monkeypatch)

    return asyncio.run(main())


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
    _, history, _ = runs["deadline"]
    out = runs["results"]
    assert "dvfs deadline" in out
    assert "energy J" in out and "total J" in out
    rows = [line.split() for line in out.splitlines()]
    printed = [(int(r[0]), r[8], r[9]) for r in rows if len(r) == 10 and r[0].isdigit()]
    total, expected = 0.0, []
    for h in history:
        total += h.energy_j
        expected.append((h.round, f"{h.energy_j:.1f}", f"{total:.1f}"))
    assert printed == expected
