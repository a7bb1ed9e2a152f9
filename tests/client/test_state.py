import os
from pathlib import Path

import torch

from fl_services.client.state import ClientStateStore


def test_state_survives_a_new_process_and_is_tied_to_its_task(tmp_path):
    store = ClientStateStore(tmp_path, "run1", 3)
    assert store.load() == {} and store.last_task_id() is None and store.saved_result("t0") is None
    store.save("t0", {"control": {"w": torch.arange(4.0)}}, b"result-0")
    again = ClientStateStore(tmp_path, "run1", 3)
    assert torch.equal(again.load()["control"]["w"], torch.arange(4.0))
    assert again.last_task_id() == "t0"
    assert again.saved_result("t0") == b"result-0"  # re-sent, not recomputed, after a crash
    assert again.saved_result("t1") is None
    assert ClientStateStore(tmp_path, "run1", 4).load() == {}
    assert ClientStateStore(tmp_path, "run2", 3).load() == {}


def test_no_temporary_files_are_left(tmp_path):
    store = ClientStateStore(tmp_path, "r", 0)
    store.save("t", {}, b"x")
    assert sorted(p.name for p in store.dir.iterdir()) == ["state.safetensors"]


def test_state_and_result_are_one_file_fsynced_before_it_is_renamed(tmp_path, monkeypatch):
    """The state must not reach the disk without its result, nor as an empty file after a host crash; one
    fsync a task (a thousand logical clients each wrote two)."""
    events: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(os, "fsync", lambda fd: (events.append("fsync"), real_fsync(fd)))
    monkeypatch.setattr(os, "replace", lambda a, b: (events.append(f"replace {Path(b).name}"), real_replace(a, b)))
    ClientStateStore(tmp_path, "r", 0).save("t", {"c": {"w": torch.ones(3)}}, b"result")
    assert events == ["fsync", "replace state.safetensors"]


def test_an_empty_result_and_an_empty_state_read_back(tmp_path):
    store = ClientStateStore(tmp_path, "r", 0)
    store.save("t", {}, b"")
    assert store.load() == {} and store.saved_result("t") == b""


def _compute(tmp_path, algorithm: str, task_id: str) -> bytes:
    from fl_services.client.config import ClientSettings
    from fl_services.client.worker import compute
    from fl_services.shared.core.algorithms import registry
    from fl_services.shared.core.config import RunConfig
    from fl_services.shared.core.federation import initial_model
    from fl_services.shared.wire.client_edge import ClientTaskHeader

    config = RunConfig(algorithm=algorithm, model={"name": "logreg"}, data={"dataset": "digits", "num_clients": 4})
    header = ClientTaskHeader(task_id=task_id, run_id="r", client_id=1, round=0, version=0, config=config)
    task = registry.create(config).client_task(registry.create(config).init_global(initial_model(config)), 1, 0)
    return compute(ClientSettings(state_dir=tmp_path, dvfs_backend="emulate"), header, task)


def test_a_task_without_client_state_writes_no_file(tmp_path):
    """FedAvg keeps nothing on the client: a crash retrains to the same tensors, so no fsynced write a task."""
    _compute(tmp_path, "fedavg", "t0")
    assert not ClientStateStore(tmp_path, "r", 1).exists()


def test_a_task_with_client_state_saves_it_with_its_result(tmp_path):
    """SCAFFOLD's control variate advances with each task: the task met again re-sends its stored result."""
    blob = _compute(tmp_path, "scaffold", "t0")
    store = ClientStateStore(tmp_path, "r", 1)
    assert store.last_task_id() == "t0" and store.saved_result("t0") == blob and store.load()
    assert _compute(tmp_path, "scaffold", "t0") == blob  # not trained again on the advanced state
