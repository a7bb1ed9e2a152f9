"""The edge's algorithm state on disk: written atomically, read back on restart, a broken file survived."""
import torch

from fl_services.edge.config import EdgeSettings
from fl_services.edge.round_loop import EdgeRoundLoop


def loop(tmp_path) -> EdgeRoundLoop:
    return EdgeRoundLoop(EdgeSettings(edge_id=2, state_dir=tmp_path), cloud=None, board=None)


def test_state_round_trips_per_run(tmp_path):
    first = loop(tmp_path)
    state = {"prototypes": {"means": torch.arange(6, dtype=torch.float64).reshape(2, 3)}}
    first.states.save("run-a", state)
    again = loop(tmp_path)  # a restarted edge
    assert torch.equal(again.states.load("run-a")["prototypes"]["means"], state["prototypes"]["means"])
    assert again.states.load("run-b") == {}
    # No temporary left; beside the run's state, the edge's key for secure aggregation between sites.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["edge2-run-a.safetensors", "edge2.mask-key"]


def test_an_unreadable_state_file_starts_afresh_and_is_kept_aside(tmp_path):
    (tmp_path / "edge2-run-a.safetensors").write_bytes(b"\x00\x01 torn write")
    assert loop(tmp_path).states.load("run-a") == {}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["edge2-run-a.corrupt", "edge2.mask-key"]


def test_the_state_is_kept_on_disk_by_default():
    assert EdgeSettings().state_dir is not None


def test_the_state_files_of_runs_that_ended_are_deleted(tmp_path):
    """They were kept for good, even after the run's deletion at the cloud (a probe found the files of two
    deleted runs on each edge); another edge's files in the same directory are its own."""
    edge = loop(tmp_path)
    state = {"prototypes": {"means": torch.zeros(2)}}
    for run_id in ("run-a", "run-b", "run-c"):
        edge.states.save(run_id, state)
    (tmp_path / "edge3-run-a.safetensors").write_bytes(b"edge 3's")
    edge._forget_ended({"run-b"})  # what a long-poll answer names live
    # The edge's key for secure aggregation between sites is no run's: it stays.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["edge2-run-b.safetensors", "edge2.mask-key",
                                                          "edge3-run-a.safetensors"]
    assert torch.equal(edge.states.load("run-b")["prototypes"]["means"], torch.zeros(2))
