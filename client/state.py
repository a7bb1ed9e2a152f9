"""Per-client state on the client's own disk, written so that a crash never applies an update twice.

For each logical client: `state.safetensors` (the algorithm's persistent tensors plus the id of the
task that produced them) and `result.safetensors` (the upload for that task). A task that meets a
state already produced by it re-sends the stored result instead of training on advanced state.
"""
from __future__ import annotations

from pathlib import Path

from safetensors import safe_open
from safetensors.torch import load_file, save

from shared.files import atomic_write
from shared.transport.records import Record, flatten, unflatten


class ClientStateStore:
    def __init__(self, root: Path, run_id: str, client_id: int):
        self.dir = Path(root) / run_id / f"client-{client_id}"
        self._state = self.dir / "state.safetensors"
        self._result = self.dir / "result.safetensors"

    def last_task_id(self) -> str | None:
        if not self._state.exists():
            return None
        with safe_open(str(self._state), framework="pt") as f:
            return (f.metadata() or {}).get("task_id")

    def load(self) -> Record:
        return unflatten(load_file(str(self._state))) if self._state.exists() else {}

    def saved_result(self, task_id: str) -> bytes | None:
        if self.last_task_id() == task_id and self._result.exists():
            return self._result.read_bytes()
        return None

    def save(self, task_id: str, state: Record, result_blob: bytes) -> None:
        # Result first: a crash between the two writes leaves the old state, and the task recomputes.
        # Each file whole or not at all, fsynced: the state must never be on disk without its result.
        atomic_write(self._result, result_blob)
        atomic_write(self._state, save({k: v.contiguous() for k, v in flatten(state).items()},
                                       metadata={"task_id": task_id}))
