"""What an edge tells the cloud of its devices in its site report: every device counted per state, the first of
them listed (failed ones first, with the run and the reason), each run's current round; bounded whatever the
number of devices."""
from __future__ import annotations

import asyncio

import pytest

from fl_services.edge.services.devices import site_devices
from fl_services.edge.tasks import TaskBoard
from fl_services.shared.core.config import Selection
from fl_services.shared.wire.client_edge import ClientRegistration
from fl_services.shared.wire.edge_cloud import (
    MAX_ID_RANGES,
    MAX_LABEL_SETS,
    MAX_REPORTED_DEVICES,
    EdgeRegistration,
    SiteRun,
)
from tests.edge.harness import CONFIG, RUN_ID, CloudDouble, Edge, answer_tasks, auth, running_edge, until
from tests.edge.test_bad_input import GOOD_SUMMARY
from tests.edge.test_client_failures import ERROR, fail_tasks, hold_tasks

pytestmark = pytest.mark.anyio


async def test_the_report_says_which_devices_train_and_which_failed_and_why() -> None:
    config = CONFIG.model_copy(update={"policy": CONFIG.policy.model_copy(
        update={"deadline_s": 60.0, "min_fraction": 1.0, "max_retries": 0})})
    cloud = CloudDouble(config)
    async with running_edge(cloud_transport=cloud.transport(), site_report_s=5.0) as edge:
        # Clients 2 and 3 fail their tasks; 0 and 1 never answer theirs: the round waits on them.
        await edge.register(0)
        await edge.register(1)
        clients = [asyncio.create_task(fail_tasks(edge, [2, 3]))]
        loop = edge.app.state.round_loop
        try:
            await until(lambda: loop.site_report().states.get("failed") == 2, timeout=30,
                        what="clients 2 and 3 reported their failures")
        finally:
            for c in clients:
                c.cancel()
        report = loop.site_report()
    assert report.report_s == 5.0 and report.devices == 4
    assert report.states == {"failed": 2, "training": 2}
    assert [(d.client_id, d.state) for d in report.device_page] == [(2, "failed"), (3, "failed"), (0, "training"),
                                                                      (1, "training")]
    assert all(d.failed_run == RUN_ID and (d.failure, d.failure_kind) == (ERROR, "training")
               for d in report.device_page[:2])
    assert all(d.runs == [RUN_ID] and d.failure is None for d in report.device_page[2:])
    assert report.runs == [SiteRun(run_id=RUN_ID, version=0, tasks=4, answered=0, failed=2)]


async def test_a_round_whose_devices_answered_counts_them() -> None:
    cloud = CloudDouble(CONFIG)
    async with running_edge(cloud_transport=cloud.transport()) as edge:
        loop = edge.app.state.round_loop
        answering = asyncio.create_task(answer_tasks(edge, range(4)))
        try:
            await until(lambda: cloud.contributions, timeout=30, what="the round is submitted")
        finally:
            answering.cancel()
        report = loop.site_report()
    assert sum(report.states.values()) == 4 and "failed" not in report.states


async def test_a_device_that_registers_is_reported_at_once_not_at_the_next_interval() -> None:
    """A run waiting for devices is admitted when the cloud hears of them: an hour's interval does not delay it."""
    cloud = CloudDouble(CONFIG)
    async with running_edge(cloud_transport=cloud.transport(), site_report_s=3600.0) as edge:
        await until(lambda: cloud.reports, timeout=30, what="the edge's registration as it starts")
        assert cloud.reports[-1].devices == 0
        await edge.register(0)
        await edge.register(1)
        await until(lambda: cloud.reports[-1].devices == 2, timeout=30, what="a report with both devices")
    assert cloud.reports[-1].report_s == 3600.0


async def test_a_device_that_goes_silent_is_reported_offline_soon_and_back_once_it_polls_again() -> None:
    """Admission counts the connected devices: the cloud hears that one went away (or came back) within a report's
    batching, not at the next periodic report, an hour away here."""
    cloud = CloudDouble(CONFIG)
    cloud.publishing = False  # no run: the device is idle while it polls
    async with running_edge(cloud_transport=cloud.transport(), site_report_s=3600.0, long_poll_max_s=0.1) as edge:
        await edge.register(0)
        await until(lambda: cloud.reports and cloud.reports[-1].states == {"idle": 1}, timeout=30,
                    what="a report with the device idle")
        # It never polls: offline once silent for offline_after_s (2 × 0.1 + 5 s).
        await until(lambda: cloud.reports[-1].states == {"offline": 1}, timeout=30, what="a report with it offline")
        assert (await edge.http.get("/api/v1/clients/0/task", params={"timeout": 0}, headers=auth())).status_code == 204
        await until(lambda: cloud.reports[-1].states == {"idle": 1}, timeout=30, what="a report with it back")
    assert len(cloud.reports) == 4  # the start's, and one per change: no periodic report came


async def test_a_run_that_ends_is_reported_soon_with_its_devices_idle() -> None:
    """The run's sites page shows its devices training until the cloud hears otherwise: an hour here."""
    cloud = CloudDouble(CONFIG)
    async with running_edge(cloud_transport=cloud.transport(), site_report_s=3600.0) as edge:
        holding = asyncio.create_task(hold_tasks(edge, range(4)))
        try:
            await until(lambda: loop_report(edge).states == {"training": 4} and cloud.reports[-1].devices == 4,
                        timeout=30, what="the round's tasks, and the report of the devices' registrations")
            reports = len(cloud.reports)
            cloud.publishing = False  # the run ended: the edge's long-poll hears no live run
            await until(lambda: len(cloud.reports) > reports, timeout=30, what="a report once the run ended")
        finally:
            holding.cancel()
    assert cloud.reports[-1].states == {"idle": 4} and cloud.reports[-1].runs == []


async def test_a_device_gone_offline_is_no_member_and_its_round_does_not_wait_for_it() -> None:
    """A run over registered devices takes the devices connected when its round starts: one that stopped polling
    gets no task, so the round is not held until its deadline (ten minutes here) and again at each retry."""
    config = CONFIG.model_copy(update={"selection": Selection(), "policy": CONFIG.policy.model_copy(
        update={"deadline_s": 600.0, "min_fraction": 1.0, "max_retries": 3})})
    cloud = CloudDouble(config)
    cloud.publishing = False
    async with running_edge(cloud_transport=cloud.transport()) as edge:
        await edge.register(3)
        edge.board.last_seen[3] -= 3600  # silent for an hour
        answering = asyncio.create_task(answer_tasks(edge, range(3)))
        try:
            await until(lambda: len(edge.board.clients) == 4, timeout=30, what="devices 0 to 2 registered")
            cloud.publishing = True
            await until(lambda: cloud.contributions, timeout=30, what="the round is submitted")
        finally:
            answering.cancel()
        assert [d.state for d in loop_report(edge).device_page] == ["idle"] * 3 + ["offline"]
    [contribution] = cloud.contributions[:1]
    assert [m.client_id for m in contribution.members or []] == [0, 1, 2]
    assert sorted(c.client_id for c in contribution.clients) == [0, 1, 2] and contribution.failures == []


def loop_report(edge: Edge) -> EdgeRegistration:
    return edge.app.state.round_loop.site_report()


def test_devices_without_a_summary_are_reported_with_their_ids_as_ranges() -> None:
    """The cloud counts such a device for a run only where its id names one of the run's partitions."""
    board = TaskBoard(offline_after_s=60)
    for k in (0, 1, 2, 5, 7, 8):
        board.register(ClientRegistration(client_id=k))
    board.register(ClientRegistration(client_id=3, summary=GOOD_SUMMARY))
    *_, label_sets = site_devices(board=board)
    assert [(s.devices, s.ids) for s in label_sets] == [(6, [(0, 2), (5, 5), (7, 8)]), (1, None)]
    for k in range(9, 9 + 2 * MAX_ID_RANGES, 2):  # past MAX_ID_RANGES ranges: not listed, all counted
        board.register(ClientRegistration(client_id=k))
    *_, label_sets = site_devices(board=board)
    assert [(s.devices, s.ids) for s in label_sets] == [(6 + MAX_ID_RANGES, None), (1, None)]


def test_ten_thousand_devices_make_a_report_of_the_same_bounded_size() -> None:
    board = TaskBoard(offline_after_s=60)
    for k in range(10_000):
        # 500 label sets, the first 100 twice as common as the others.
        board.register(ClientRegistration(client_id=10_000 + 7 * k, labels={"family": "cnn",
                                                                             "group": str(k % 600 % 500)}))
    states, page, runs, label_sets = site_devices(board=board)
    assert states == {"idle": 10_000} and runs == []
    assert len(label_sets) == MAX_LABEL_SETS and {s.devices for s in label_sets} == {33}
    assert {int(s.labels["group"]) for s in label_sets} <= set(range(100))
    assert len(page) == MAX_REPORTED_DEVICES
    assert [d.client_id for d in page] == [10_000 + 7 * k for k in range(MAX_REPORTED_DEVICES)]
    assert {d.family for d in page} == {"cnn"}
    report = EdgeRegistration(edge_id=0, devices=10_000, states=states, device_page=page, label_sets=label_sets)
    assert len(report.model_dump_json()) < EdgeRegistration.max_body_bytes
    # Everyone offline (a clock far ahead): counted as such, none lost.
    board.offline_after_s = -1
    states, _, _, label_sets = site_devices(board=board)
    assert states == {"offline": 10_000} and label_sets == []


def test_a_device_whose_result_is_arriving_is_uploading() -> None:
    board = TaskBoard(offline_after_s=60)
    board.register(ClientRegistration(client_id=5))
    with board.receiving(5), board.receiving(5):  # a retried upload beside the first
        assert site_devices(board=board)[0] == {"uploading": 1}
    assert site_devices(board=board)[0] == {"idle": 1}
