"""Contributions travel as float32 (Algorithm.wire_spec): the edge sums in float64 and rounds once; the
cloud widens what arrived back to the dtypes its update computes with; groups an algorithm keeps exact
travel as they are."""
from __future__ import annotations

import asyncio

import pytest
import torch

from fl_services.cloud.initial_state import _contribution_bytes
from fl_services.shared.core.algorithms import registry
from fl_services.shared.core.algorithms.base import MODEL, ClientResult, Contribution
from fl_services.shared.core.config import RunConfig
from fl_services.shared.core.edge_round import ClientTask, run_edge_round
from fl_services.shared.core.federation import initial_model
from fl_services.shared.core.records import flatten
from fl_services.shared.core.reports import ClientParticipation
from fl_services.shared.core.tensors import InvalidContent

SMALL = dict(model={"name": "logreg"}, data={"dataset": "digits", "num_clients": 4}, rounds=1)


def _results(algorithm, tasks: list[ClientTask]) -> list[ClientResult]:
    # Steps of a third: not representable in float32, so the edge's float64 sum must be rounded to travel.
    return [ClientResult(t.client_id, 10 + t.client_id, 0.5,
                         {MODEL: {n: torch.full_like(w, 1 / 3) for n, w in t.tensors[MODEL].items()}})
            for t in tasks]


def _edge_round(config: RunConfig):
    algorithm = registry.create(config)
    global_ = algorithm.init_global(initial_model(config))

    async def train(tasks: list[ClientTask]) -> list[ClientResult]:
        return _results(algorithm, tasks)

    return algorithm, global_, asyncio.run(run_edge_round(algorithm, global_, 0, 0, {}, train))


def test_an_edge_sends_its_float64_sums_rounded_once_to_float32():
    algorithm, global_, outcome = _edge_round(RunConfig(**SMALL))
    sent = outcome.aggregate.tensors[MODEL]
    assert {t.dtype for t in sent.values()} == {torch.float32}
    third = float(torch.tensor(1 / 3, dtype=torch.float32))
    exact = sum(r.num_samples * third for r in sorted(outcome.results, key=lambda r: r.client_id))  # in float64
    assert float(torch.tensor(exact, dtype=torch.float32)) != exact  # so the rounding is seen
    for t in sent.values():
        assert torch.equal(t, torch.full_like(t, exact, dtype=torch.float64).to(torch.float32))
    # What the cloud checks is what was sent.
    algorithm.check_contribution(global_, [r.client_id for r in outcome.results], outcome.aggregate.tensors,
                                 outcome.aggregate.weight)


def test_the_cloud_refuses_float64_sums_and_widens_what_arrived_exactly():
    algorithm, global_, outcome = _edge_round(RunConfig(**SMALL))
    tensors = outcome.aggregate.tensors
    doubled = {MODEL: {n: t.double() for n, t in tensors[MODEL].items()}}
    with pytest.raises(InvalidContent, match="has dtype torch.float64, expected torch.float32"):
        algorithm.check_contribution(global_, [r.client_id for r in outcome.results], doubled,
                                     outcome.aggregate.weight)
    widened = algorithm.from_wire(global_, Contribution(0, 0, tensors, outcome.aggregate.weight))
    for name, t in widened.tensors[MODEL].items():
        assert t.dtype == torch.float64
        assert torch.equal(t, tensors[MODEL][name].double())


def test_hfpl_prototypes_travel_in_float64():
    config = RunConfig(algorithm="hfpl", model={"name": "logreg"},
                       data={"dataset": "digits", "num_clients": 4}, rounds=1)
    algorithm = registry.create(config)
    global_ = algorithm.init_global(initial_model(config))
    spec = flatten(algorithm.contribution_spec(global_, [0]))
    wire = flatten(algorithm.wire_spec(algorithm.contribution_spec(global_, [0])))
    assert wire == spec  # its means and counts float64, its features float32 already
    assert any(dtype == torch.float64 for _, dtype in wire.values())


def test_per_client_float32_deltas_stay_float32_at_the_cloud():
    """FedVARP's contribution carries each Δw_k in the model's dtype: nothing to widen."""
    config = RunConfig(algorithm="fedvarp", **SMALL)
    algorithm = registry.create(config)
    global_ = algorithm.init_global(initial_model(config))
    spec = algorithm.contribution_spec(global_, [0])
    tensors = {g: {n: torch.zeros(tuple(shape), dtype=dtype) for n, (shape, dtype) in members.items()}
               for g, members in algorithm.wire_spec(spec).items()}
    only = (ClientParticipation(client_id=0, num_samples=10, loss=0.5),)
    widened = algorithm.from_wire(global_, Contribution(0, 0, tensors, 10.0, only))
    assert flatten({g: {n: t.dtype for n, t in m.items()} for g, m in widened.tensors.items()}) ==\
        {k: dtype for k, (_, dtype) in flatten(spec).items()}


def test_a_contribution_takes_four_bytes_a_parameter_against_the_payload_limit():
    """The 64 MiB default refused models over ~8.4M parameters when sums travelled as float64."""
    config = RunConfig(**SMALL)
    algorithm = registry.create(config)
    global_ = algorithm.init_global(initial_model(config))
    parameters = sum(t.numel() for t in global_[MODEL].values())
    assert 4 * parameters < _contribution_bytes(algorithm, global_, 0) < 4 * parameters + 10_000
