"""What the edge keeps of each run it serves: its lane (algorithm, edge state, round in progress), and its edge
state on disk."""
from __future__ import annotations

import asyncio
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

from fl_services.edge.membership import Membership
from fl_services.edge.pacing import EdgePacing
from fl_services.shared.core.algorithms.base import Algorithm
from fl_services.shared.core.config import RunConfig
from fl_services.shared.core.data.summary import RunTask
from fl_services.shared.core.late import LateAnswer
from fl_services.shared.core.records import Record, decode_state, encode
from fl_services.shared.core.tensors import PayloadError
from fl_services.shared.runtime.files import atomic_write
from fl_services.shared.wire.backoff import Backoff

log = logging.getLogger(__name__)


@dataclass
class Lane:
    """One run as this edge serves it: its algorithm, its edge state, and its round in progress."""

    config: RunConfig
    algorithm: Algorithm
    edge_state: Record
    backoff: Backoff
    # DVFS: the budget each task gives its client, from this run's rounds (edge/pacing.py).
    pacing: EdgePacing
    # The last version whose round succeeded: the long-poll asks for a newer one. It moves only after a
    # successful round, so after a failure the same state (or a newer one, if the cloud moved on) is
    # fetched again and its round re-run, instead of the edge waiting for a version that never comes.
    done: int = -1
    # The round in progress (or the wait after a failed one): the run is not offered again meanwhile.
    task: asyncio.Task[None] | None = None
    # The clients' sample counts as the edge derives them from the run (None: it cannot know them).
    num_samples: list[int] | None = None
    # What a run over registered devices trains (its model's input shape and classes): their data must fit it.
    trains: RunTask | None = None
    samples_known: bool = False
    # A run over registered devices: its members and refusals here, as its last round (or try at one) found them.
    membership: Membership | None = None
    # Devices registered here that another site holds in this run (device -> its edge), as the cloud said when it
    # refused a contribution declaring them: a device is one member of the federation.
    elsewhere: dict[int, int] = field(default_factory=dict)
    # Late answers taken off the board for the next contribution (policy.late = 'join'), until it is sent. Kept in
    # memory only: an edge that restarts drops them (their devices' tasks are gone with its board).
    joined: list[LateAnswer] = field(default_factory=list)


class StateFiles:
    """This edge's algorithm state of each run on disk (nothing without a directory), so that a restarted edge
    resumes where it stopped: one file per run, `edge<id>-<run>.safetensors`."""

    def __init__(self, edge_id: int, directory: Path | None):
        self.edge_id = edge_id
        self.directory = directory

    def path(self, run_id: str) -> Path | None:
        if self.directory is None:
            return None
        return self.directory / f"edge{self.edge_id}-{run_id}.safetensors"

    def load(self, run_id: str) -> Record:
        path = self.path(run_id)
        if path is None or not path.exists():
            return {}
        try:
            return decode_state(path.read_bytes())
        except PayloadError:
            # Unreadable (e.g. a disk that lost its last write): start afresh, loudly, and keep the file.
            log.error("edge %d: state file %s is unreadable; starting run %s without it", self.edge_id, path, run_id)
            os.replace(path, path.with_suffix(".corrupt"))
            return {}

    def save(self, run_id: str, state: Record) -> None:
        """Atomically, so a crash leaves the previous state or this one. Saved before the submit: an
        edge that restarts re-runs the round, its clients answer from their saved results, and the
        incremental aggregation replaces each client's prototype, so nothing is counted twice."""
        path = self.path(run_id)
        if path is None:
            return
        atomic_write(path, encode(state))

    def keep_only(self, live: set[str]) -> None:
        """Deletes this edge's state files of the runs that are not live: an ended run never resumes, and
        each file (every client's memory of the run) would outlive even the run's deletion at the cloud. Those
        of runs that ended while the edge was down go too."""
        if self.directory is None or not self.directory.is_dir():
            return
        prefix = f"edge{self.edge_id}-"
        for path in self.directory.glob(f"{prefix}*.safetensors"):
            if path.name.removeprefix(prefix).removesuffix(".safetensors") not in live:
                path.unlink(missing_ok=True)
