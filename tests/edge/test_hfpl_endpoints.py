"""The edge's result endpoint with an hfpl task: a client's (c_i, counts, X_i, y_i) is checked before it counts.

Same in-process edge as test_bad_input.py, whose helpers are reused; the task is posted with the check
the round loop gives hfpl tasks, `partial(algorithm.check_result, task_tensors)`.
"""
from __future__ import annotations

import math
from functools import partial

import pytest
import torch

from fl_services.edge.tasks import Task
from fl_services.shared.core.algorithms import registry
from fl_services.shared.core.config import RunConfig
from fl_services.shared.core.federation import initial_model
from fl_services.shared.core.records import flatten
from fl_services.shared.core.tensors import Tensors, encode
from fl_services.shared.wire.client_edge import ClientTaskHeader
from tests.edge.harness import (
    ACCEPTED,
    RUN_ID,
    Edge,
    result_header,
    task_id,
)
from tests.web import detail_of

pytestmark = pytest.mark.anyio

NUM_CLASSES, DIM, CAP = 10, 8, 5  # digits has 10 classes
CONFIG = RunConfig.model_validate(dict(
    algorithm="hfpl", rounds=3, model={"name": "logreg"},
    data=dict(dataset="digits", partition="dirichlet", alpha=0.3, num_clients=6),
    topology=dict(num_edges=3, buffer_size=2), params=dict(feature_dim=DIM, feature_cap=CAP),
))
ALGORITHM = registry.create(CONFIG)
TASK = ALGORITHM.client_task(ALGORITHM.init_global(initial_model(CONFIG)), 0, 0)


async def open_hfpl_task(edge: Edge, client_id: int = 0) -> None:
    await edge.register(client_id)
    header = ClientTaskHeader(task_id=task_id(client_id), run_id=RUN_ID, client_id=client_id, round=0, version=0,
                              config=CONFIG)
    await edge.board.post([Task(header, TASK, partial(ALGORITHM.check_result, TASK))])


def answer(n: int = CAP, **replace: torch.Tensor) -> Tensors:
    """A valid client result with n feature rows; `replace` swaps single tensors."""
    good = {
        "prototypes/means": torch.linspace(-1, 1, NUM_CLASSES * DIM, dtype=torch.float64).reshape(NUM_CLASSES, DIM),
        "prototypes/counts": torch.tensor([3, 0, 1, 4, 0, 2, 5, 0, 1, 2], dtype=torch.int64),
        "sample/features": torch.randn(n, DIM, generator=torch.Generator().manual_seed(n)),
        "sample/labels": torch.tensor([0, 2, 3, 6, 9, 5, 6][:n], dtype=torch.int64),
    }
    return {**good, **{WIRE[k]: t for k, t in replace.items()}}


WIRE = {"labels": "sample/labels", "class_counts": "prototypes/counts"}  # as the record codec names them


def _bad(case: str) -> tuple[Tensors, str]:
    labels = answer()["sample/labels"]
    in_range = f"labels must lie in [0, {NUM_CLASSES})"
    if case == "negative-label":
        return answer(labels=torch.cat([labels[:-1], torch.tensor([-1])])), in_range
    if case == "label-equals-J":
        return answer(labels=torch.cat([labels[:-1], torch.tensor([NUM_CLASSES])])), in_range
    if case == "labels-longer":
        return answer(labels=torch.cat([labels, torch.tensor([1])])),\
            f"tensor 'sample/labels' has shape [{CAP + 1}], expected ['n={CAP}']"
    if case == "above-feature-cap":  # the cap is per client at the edge: feature_cap rows
        return answer(CAP + 1),\
            f"tensor 'sample/features' has shape [{CAP + 1}, {DIM}], expected ['n<={CAP}', {DIM}]"
    if case == "negative-class-count":
        return answer(class_counts=torch.tensor([3, 0, 1, 4, 0, -2, 5, 0, 1, 2])),\
            "class counts must not be negative"
    bad = answer()
    target = {"nan-prototype": "prototypes/means", "nan-feature": "sample/features"}[case]
    values = bad[target].clone()
    values[1, 2] = math.nan
    return {**bad, target: values}, f"tensor {target!r} contains NaN or Inf"


@pytest.mark.parametrize("case", ["negative-label", "label-equals-J", "labels-longer", "above-feature-cap",
                                  "negative-class-count", "nan-prototype", "nan-feature"])
async def test_invalid_result_refused_and_task_stays_open(edge: Edge, case: str) -> None:
    await open_hfpl_task(edge)
    tensors, fragment = _bad(case)
    before = await edge.snapshot(0)
    r = await edge.send_result(0, encode(tensors, result_header(0)))
    detail_of(r, 422, fragment)
    assert await edge.snapshot(0) == before
    assert before["open"] == {0: task_id(0)}
    ok = await edge.send_result(0, encode(answer(), result_header(0)))  # the task can still be answered
    assert ok.status_code == 202, ok.text


@pytest.mark.parametrize("n", [0, 3, CAP], ids=["no-rows", "some-rows", "at-the-cap"])
async def test_valid_result_accepted(edge: Edge, n: int) -> None:
    await open_hfpl_task(edge)
    sent = answer(n)
    r = await edge.send_result(0, encode(sent, result_header(0)))
    assert r.status_code == 202 and r.json() == ACCEPTED, r.text
    (kept,) = edge.board.results()
    kept_tensors = flatten(kept.tensors)
    assert kept.client_id == 0 and kept_tensors.keys() == sent.keys()
    assert all(torch.equal(kept_tensors[k], sent[k]) for k in sent)
    assert await edge.open_task(0) is None  # answered: nothing left to fetch
