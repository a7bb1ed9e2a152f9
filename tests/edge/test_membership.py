"""A run's members at an edge: the simulated roster without a selection; with one, the registered devices its
device selector takes whose data fits the run's task, the others refused with the reason."""
from fl_services.edge.membership import members
from fl_services.shared.core.config import RunConfig
from fl_services.shared.core.data.summary import DataSummary, RunTask
from fl_services.shared.wire.client_edge import ClientRegistration

TASK = RunTask(input_shape=(1, 8, 8), num_classes=10)


def device(client_id: int, shape=(1, 8, 8), samples: int = 20, **labels: str) -> ClientRegistration:
    summary = DataSummary(samples=samples, held_out_samples=5, input_shape=shape, labels=(0, 1), histogram={0: samples})
    return ClientRegistration(client_id=client_id, labels=labels, summary=summary)


def test_without_a_selection_the_members_are_the_runs_roster_here():
    config = RunConfig(data={"num_clients": 5}, topology={"num_edges": 2, "buffer_size": 2})
    found = members(config, 1, {1007: device(1007)}, None, [10, 11, 12, 13, 14])
    assert found.ids == [1, 3] and found.samples == {1: 11, 3: 13} and found.refused == []


def test_with_a_selection_the_members_are_the_registered_devices_it_takes():
    config = RunConfig(selection={"devices": {"kind": "npz"}})
    devices = {7: device(7, kind="npz"), 1007: device(1007, samples=33, kind="npz"), 2: device(2, kind="csv"),
               5: device(5, shape=(64,), kind="npz")}
    found = members(config, 0, devices, TASK, None)
    assert found.ids == [7, 1007] and found.samples == {7: 20, 1007: 33}
    assert [f.client_id for f in found.refused] == [5]
    assert "its samples have shape 64 but the run's model takes 1x8x8" in found.refused[0].error
    assert [(m.client_id, m.num_samples) for m in found.declared()] == [(7, 20), (1007, 33)]


def test_a_device_without_a_summary_is_a_member_whose_count_is_unknown():
    found = members(RunConfig(selection={}), 0, {3: ClientRegistration(client_id=3)}, TASK, None)
    assert found.ids == [3] and found.samples == {}


def test_a_device_without_a_summary_whose_id_names_no_partition_of_the_run_is_refused():
    """It would train partition `id` of the run's data set, which has data.num_clients of them: a device 306 of a
    run of 10 would fail every round it is given (PartitionSpec: "index 306 is not among the 10 clients")."""
    devices = {3: ClientRegistration(client_id=3), 306: ClientRegistration(client_id=306), 307: device(307)}
    found = members(RunConfig(selection={}, data={"num_clients": 10}), 0, devices, TASK, None)
    assert found.ids == [3, 307]
    [refused] = found.refused
    assert refused.client_id == 306 and refused.kind == "misfit" and "data.num_clients: 0 … 9" in refused.error


def test_a_device_whose_registration_cannot_be_declared_is_refused_and_the_others_stay_members():
    """Whatever let such a registration in (a summary built without validation), it is that device's refusal with
    its reason, never an error of the round that would stop every other device's training."""
    bad = DataSummary.model_construct(samples=10**12 + 1, held_out_samples=0, input_shape=(1, 8, 8), labels=(0,),
                                      histogram={0: 10**12 + 1})
    devices = {7: ClientRegistration.model_construct(client_id=7, labels={}, summary=bad, num_samples=0,
                                                     capabilities={}), 8: device(8)}
    found = members(RunConfig(selection={}), 0, devices, TASK, None)
    assert found.ids == [8] and [m.client_id for m in found.declared()] == [8]
    [refused] = found.refused
    assert refused.client_id == 7 and "cannot be declared" in refused.error and "1000000000000" in refused.error
