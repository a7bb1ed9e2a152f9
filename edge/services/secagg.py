"""What the edge does for a device's secure-aggregation requests: finds the device's round and hands the message to
its protocol (edge/secagg.py), which only relays what it cannot read."""
from __future__ import annotations

import numpy as np
import torch

from fl_services.edge.round_loop import EdgeRoundLoop
from fl_services.edge.secagg import SecureRound
from fl_services.edge.tasks import TaskBoard, TaskConflict
from fl_services.shared.core.records import Record
from fl_services.shared.core.secagg.sites import MASKED
from fl_services.shared.core.tensors import InvalidContent
from fl_services.shared.wire.secagg import SecAggKeys, SecAggShares, SecAggStep, SecAggUnmask, Step


def round_of(loop: EdgeRoundLoop, task_id: str) -> SecureRound:
    """The secure round the task belongs to (409 once it is over)."""
    found = next((r for r in loop.secure_rounds.values() if task_id in r.tasks), None)
    if found is None:
        raise TaskConflict(f"task {task_id!r} is in no secure round under way", "stale")
    return found


async def add_keys(*, loop: EdgeRoundLoop, board: TaskBoard, client_id: int, task_id: str, keys: SecAggKeys) -> None:
    await round_of(loop, task_id).add_keys(board, client_id, task_id, keys)


async def add_shares(*, loop: EdgeRoundLoop, client_id: int, task_id: str, shares: SecAggShares) -> None:
    await round_of(loop, task_id).add_shares(client_id, task_id, shares)


async def add_masked(*, loop: EdgeRoundLoop, client_id: int, task_id: str, tensors: Record) -> None:
    """The masked input: one int64 tensor of the ring's words (read as uint64)."""
    words = tensors.get(MASKED, {}).get(MASKED)
    if set(tensors) != {MASKED} or set(tensors[MASKED]) != {MASKED} or words is None \
            or words.dtype != torch.int64 or words.dim() != 1:
        raise InvalidContent(f"a masked input is one int64 vector named {MASKED}/{MASKED}")
    await round_of(loop, task_id).add_masked(client_id, task_id, words.numpy().view(np.uint64))


async def add_unmask(*, loop: EdgeRoundLoop, client_id: int, task_id: str, unmask: SecAggUnmask) -> None:
    await round_of(loop, task_id).add_unmask(client_id, task_id, unmask)


async def wait_step(*, loop: EdgeRoundLoop, client_id: int, task_id: str, step: Step,
                    timeout: float) -> SecAggStep | None:
    return await round_of(loop, task_id).wait_step(client_id, task_id, step, timeout)
