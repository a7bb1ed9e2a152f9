"""The latest global state of each active run, kept in this cloud process as the bytes edges are served.

Every edge of a run fetches each version (a long-poll answered with the blob) and every contribution is
checked against it: read from the storage each time, a 60 MB state would cost a read of 60 MB per fetch
and per submit. Here it is read once per version and process (or not at all by the replica that computed it),
and a submit's check reads only its header (`records.layout`). One blob per active run is held.
"""
from __future__ import annotations

from collections.abc import Collection

from fl_services.cloud.storage import Store
from fl_services.shared.core.records import Record, layout


class GlobalStates:
    def __init__(self, store: Store):
        self.store = store
        self._latest: dict[str, tuple[int, bytes]] = {}

    def keep(self, run_id: str, version: int, blob: bytes) -> None:
        """A version just published (or read): kept unless a newer one is."""
        if run_id not in self._latest or self._latest[run_id][0] < version:
            self._latest[run_id] = (version, blob)

    async def blob(self, run_id: str, version: int) -> bytes:
        """The run's global state at `version` or newer (its header says which)."""
        kept = self._latest.get(run_id)
        if kept is not None and kept[0] >= version:
            return kept[1]
        current, blob = await self.store.versioned_global(run_id)
        self.keep(run_id, current, blob)
        return blob

    async def layout(self, run_id: str) -> Record:
        """The shapes and dtypes of the run's latest global state (meta tensors), as the check of a
        contribution needs them."""
        return layout(await self.blob(run_id, 0))

    def retain(self, run_ids: Collection[str]) -> None:
        """Forgets every run but these (the active ones): an ended run's state is no longer served."""
        for run_id in set(self._latest) - set(run_ids):
            del self._latest[run_id]
