"""Per-client state on the client's own disk, written so that a crash never applies an update twice.

For each logical client, one file, `state.safetensors`: the algorithm's persistent tensors, the id of the
task that produced them, and the upload for that task (its bytes as one uint8 tensor), written whole or
not at all. A task that meets a state already produced by it re-sends the stored result instead of
training on advanced state. One fsynced write per task: state and result in one file, so no crash can leave
one without the other, and a task costs one fsync rather than two.
"""
from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterable
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save

from fl_services.shared.core.records import Record, flatten, unflatten
from fl_services.shared.runtime.files import atomic_write

_RESULT = "result"  # the key of the stored upload: not a record key, which always holds a "/"


class ClientStateStore:
    def __init__(self, root: Path, run_id: str, client_id: int):
        self.dir = Path(root) / run_id / f"client-{client_id}"
        self._state = self.dir / "state.safetensors"

    def exists(self) -> bool:
        return self._state.exists()

    def last_task_id(self) -> str | None:
        if not self._state.exists():
            return None
        with safe_open(str(self._state), framework="pt") as f:
            return (f.metadata() or {}).get("task_id")

    def load(self) -> Record:
        if not self._state.exists():
            return {}
        stored = load_file(str(self._state))
        stored.pop(_RESULT, None)
        return unflatten(stored)

    def saved_result(self, task_id: str) -> bytes | None:
        if self.last_task_id() != task_id:
            return None
        with safe_open(str(self._state), framework="pt") as f:
            return f.get_tensor(_RESULT).numpy().tobytes() if _RESULT in f.keys() else None

    def save(self, task_id: str, state: Record, result_blob: bytes) -> None:
        # One file, fsynced before its rename: the state is never on disk without its result.
        tensors = {k: v.contiguous() for k, v in flatten(state).items()}
        tensors[_RESULT] = (torch.frombuffer(bytearray(result_blob), dtype=torch.uint8) if result_blob
                            else torch.empty(0, dtype=torch.uint8))  # frombuffer refuses an empty buffer
        atomic_write(self._state, save(tensors, metadata={"task_id": task_id}))


def drop_ended_runs(root: Path, live: set[str], client_ids: Iterable[int]) -> None:
    """Deletes these clients' state of every run that is not live (an ended run never resumes; its state
    stayed on the device for good, even after the run's deletion). Other processes may share `root`: only
    these clients' directories go, and a run's directory once empty."""
    if not Path(root).is_dir():
        return
    for run_dir in Path(root).iterdir():
        if not run_dir.is_dir() or run_dir.name in live:
            continue
        for k in client_ids:
            shutil.rmtree(run_dir / f"client-{k}", ignore_errors=True)
        with contextlib.suppress(OSError):  # another process's clients still have theirs
            run_dir.rmdir()
