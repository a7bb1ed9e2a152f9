"""Bad input at every cloud endpoint: the exact 4xx code, a clear `detail`, and no change of state.

The cloud runs in-process (httpx.ASGITransport, lifespan entered by hand) against a real Redis
(the session `redis_url` fixture); every test has its own key prefix. "State unchanged" is checked
twice: through the API (run info, history) and as a dump of every Redis key under the test's prefix.
"""
from __future__ import annotations

import asyncio
import json
import math
import os
import uuid
from collections.abc import Awaitable
from functools import partial
from typing import Any

import httpx
import numpy as np
import pytest
import redis.asyncio as aioredis
import torch
from safetensors.torch import save as st_save

from fl_services.shared.core.algorithms import registry
from fl_services.shared.core.config import RunConfig
from fl_services.shared.core.reports import ClientParticipation
from fl_services.shared.core.tensors import Tensors, encode
from fl_services.shared.wire.edge_cloud import EdgeRegistration
from fl_services.shared.wire.protocol import SAFETENSORS
from tests.cloud.harness import (
    ADMIN_TOKEN,
    EDGE_TOKEN,
    UNKNOWN_RUN,
    Cloud,
    contribution,
    contribution_header,
    running_cloud,
    running_run,
    small_config,
    two_edge_config,
    zeros_like,
)
from tests.shared import user_factories
from tests.web import OVERSIZED, assert_refuses_oversized, bearer, detail_of, not_safetensors, raw_message

pytestmark = pytest.mark.anyio


# =================================================================================================
# Control API (admin token)
# =================================================================================================
ADMIN_ENDPOINTS = [
    ("GET", "/api/v1/runs"),
    ("POST", "/api/v1/runs"),
    ("GET", "/api/v1/runs/{run}"),
    ("POST", "/api/v1/runs/{run}/start"),
    ("POST", "/api/v1/runs/{run}/pause"),
    ("POST", "/api/v1/runs/{run}/resume"),
    ("POST", "/api/v1/runs/{run}/stop"),
    ("GET", "/api/v1/runs/{run}/history"),
    ("GET", "/api/v1/runs/{run}/model"),
]
ADMIN_IDS = [f"{m} {p.removeprefix('/api/v1')}" for m, p in ADMIN_ENDPOINTS]


@pytest.mark.parametrize(
    ("token", "expected"),
    [(None, "missing bearer token"), ("not-the-admin-token", "invalid bearer token"),
     (EDGE_TOKEN, "invalid bearer token")],
    ids=["missing-token", "wrong-token", "edge-token"],
)
@pytest.mark.parametrize(("method", "path"), ADMIN_ENDPOINTS, ids=ADMIN_IDS)
async def test_control_api_refuses_bad_tokens(cloud: Cloud, method: str, path: str, token: str | None,
                                              expected: str) -> None:
    run_id = await cloud.create_run()
    before = await cloud.snapshot(run_id)
    kwargs: dict[str, Any] = {"json": small_config()} if method == "POST" and path.endswith("runs") else {}
    r = await cloud.http.request(method, path.format(run=run_id), headers=bearer(token), **kwargs)
    assert detail_of(r, 401) == expected
    assert r.headers["www-authenticate"] == "Bearer"
    assert await cloud.snapshot(run_id) == before


async def test_control_api_refuses_non_bearer_scheme(cloud: Cloud) -> None:
    before = await cloud.snapshot()
    r = await cloud.http.post("/api/v1/runs", json=small_config(), headers={"Authorization": f"Basic {ADMIN_TOKEN}"})
    assert detail_of(r, 401) == "missing bearer token"
    assert await cloud.snapshot() == before


NESTED = b"[" * 2000 + b"]" * 2000  # past json's recursion limit, within a registration's 4 KiB


@pytest.mark.parametrize("body", [b"{not json", b'{"rounds": -1}', NESTED], ids=["not-json", "invalid", "nested"])
@pytest.mark.parametrize(("path", "token"), [("/api/v1/runs", "admin"), ("/api/v1/edges", "edge")])
async def test_the_token_is_checked_before_the_body(cloud: Cloud, path: str, token: str, body: bytes) -> None:
    before = await cloud.snapshot()
    headers = {"Authorization": "Bearer wrong", "Content-Type": "application/json"}
    r = await cloud.http.post(path, content=body, headers=headers)
    assert detail_of(r, 401) == "invalid bearer token"
    right = bearer(ADMIN_TOKEN if token == "admin" else EDGE_TOKEN)
    r = await cloud.http.post(path, content=body, headers={**headers, **right})
    assert r.status_code == (400 if body == NESTED else 422), r.text
    assert await cloud.snapshot() == before


@pytest.mark.parametrize(
    ("body", "error_type"),
    [(b'{"rounds": 2,', "json_invalid"), (b"rounds=2", "json_invalid"), (b"\xff\xfe", "json_invalid"),
     (b"[]", "model_type"), (b'"fedavg"', "model_type")],
    ids=["truncated", "not-json", "not-utf8", "array", "string"],
)
async def test_create_run_malformed_json(cloud: Cloud, body: bytes, error_type: str) -> None:
    before = await cloud.snapshot()
    r = await cloud.admin("POST", "/api/v1/runs", content=body, headers={"Content-Type": "application/json"})
    detail = detail_of(r, 422)
    assert {e["type"] for e in detail} == {error_type}, detail
    assert all(e["loc"][0] == "body" for e in detail)
    assert await cloud.snapshot() == before
    assert (await cloud.admin("GET", "/api/v1/runs")).json() == []


@pytest.mark.parametrize(
    ("body", "fragment"),
    [(b'{"server_lr": 1e400}', "finite_number"), (b'{"local": {"lr": NaN}}', "finite_number"),
     (b'{"rounds": 1e400}', "int_type"), (b'{"fraction": Infinity}', "finite_number"),
     (b'{"algorithm": "fedprox", "params": {"mu": 1e400}}', "params.mu must be a finite number"),
     (b'{"name": "\\ud800"}', "string_unicode")],
    ids=["inf-float", "nan-float", "inf-int", "infinity-literal", "inf-param", "lone-surrogate"],
)
async def test_create_run_non_finite_or_unencodable(cloud: Cloud, body: bytes, fragment: str) -> None:
    """JSON's 1e400 is inf: once stored (as null) it made every read of the runs answer 500, and a 422
    echoing it could not be rendered (a 500 and a dropped connection)."""
    before = await cloud.snapshot()
    r = await cloud.admin("POST", "/api/v1/runs", content=body, headers={"Content-Type": "application/json"})
    detail_of(r, 422, fragment)
    assert await cloud.snapshot() == before
    assert (await cloud.admin("GET", "/api/v1/runs")).json() == []


@pytest.mark.parametrize(
    ("config", "loc"),
    [(small_config(learning_rate=0.1), ["body", "learning_rate"]),
     (small_config(model={"name": "logreg", "layers": 3}), ["body", "model", "layers"]),
     (small_config(topology={"num_edges": 1, "buffer_size": 1, "edges": 2}), ["body", "topology", "edges"])],
    ids=["top-level", "nested-model", "nested-topology"],
)
async def test_create_run_unknown_config_key(cloud: Cloud, config: dict[str, Any], loc: list[str]) -> None:
    before = await cloud.snapshot()
    r = await cloud.admin("POST", "/api/v1/runs", json=config)
    detail = detail_of(r, 422, "Extra inputs are not permitted")
    assert [(e["type"], e["loc"]) for e in detail] == [("extra_forbidden", loc)]
    assert await cloud.snapshot() == before


async def test_create_run_unknown_algorithm(cloud: Cloud) -> None:
    before = await cloud.snapshot()
    r = await cloud.admin("POST", "/api/v1/runs", json=small_config(algorithm="fedmagic"))
    detail_of(r, 422, "unknown algorithm 'fedmagic'", f"available: {', '.join(registry.available())}")
    assert await cloud.snapshot() == before


@pytest.mark.parametrize("rounds", [-1, 0, "two", 1.5, True, "3", 3.0],
                         ids=["negative", "zero", "string", "fraction", "boolean", "numeral", "float"])
async def test_create_run_bad_rounds(cloud: Cloud, rounds: Any) -> None:
    before = await cloud.snapshot()
    r = await cloud.admin("POST", "/api/v1/runs", json=small_config(rounds=rounds))
    detail = detail_of(r, 422)
    assert [e["loc"] for e in detail] == [["body", "rounds"]], detail
    assert await cloud.snapshot() == before


@pytest.mark.parametrize(("overrides", "locs"), [
    ({"rounds": 0, "model": {"name": "resnet"}, "algorithm": "fedmagic", "local": {"epochs": 0}},
     [["body", "algorithm"], ["body", "local", "epochs"], ["body", "model", "name"], ["body", "rounds"]]),
    ({"seed": -1, "algorithm": "fedprox", "params": {"mu": -1, "nu": 1}},
     [["body", "params", "mu"], ["body", "params", "nu"], ["body", "seed"]]),
    ({"topology": {"num_edges": 5}}, [["body", "topology", "num_edges"]]),
    ({"algorithm": "scaffold", "topology": {"num_edges": 2, "buffer_size": 1}}, [["body", "topology", "buffer_size"]]),
    ({"data": {"dataset": "npz"}}, [["body", "data", "path"]]),
], ids=["fields-and-algorithm", "fields-and-params", "edges-without-clients", "synchronous-buffer", "npz-path"])
async def test_create_run_reports_every_error_at_once_at_its_place(cloud: Cloud, overrides: dict[str, Any],
                                                                   locs: list[list[str]]) -> None:
    before = await cloud.snapshot()
    r = await cloud.admin("POST", "/api/v1/runs", json=small_config(**overrides))
    detail = detail_of(r, 422)
    assert sorted(e["loc"] for e in detail) == locs, detail
    assert await cloud.snapshot() == before


async def test_create_run_integers_and_numbers_take_no_boolean_or_string(cloud: Cloud) -> None:
    """Every such field at once, each at its place (the probe's krum_byzantine: false made f = 0)."""
    before = await cloud.snapshot()
    r = await cloud.admin("POST", "/api/v1/runs", json=small_config(
        aggregation={"krum_byzantine": False}, data={"dataset": "digits", "num_clients": True},
        local={"epochs": "2", "lr": True}, algorithm="fedprox", params={"mu": False}))
    detail = detail_of(r, 422)
    assert sorted(e["loc"] for e in detail) == [["body", "aggregation", "krum_byzantine"],
                                                ["body", "data", "num_clients"], ["body", "local", "epochs"],
                                                ["body", "local", "lr"], ["body", "params", "mu"]], detail
    assert await cloud.snapshot() == before


@pytest.mark.parametrize(
    ("overrides", "fragment"),
    [({"params": {"mu": 0.1}}, "mu"),
     ({"topology": {"num_edges": 5, "buffer_size": 5}}, "every edge needs at least one client"),
     ({"algorithm": "scaffold", "topology": {"num_edges": 2, "buffer_size": 1}}, "buffer_size must equal num_edges"),
     ({"fraction": 0}, "greater than 0"),
     ({"data": {"dataset": "npz"}}, "needs a path"),
     ({"dvfs": {"profile": "pentium"}}, "unknown device profile 'pentium'; known: rpi4"),
     ({"dvfs": {"profiles": ["rpi4", "abacus"]}}, "unknown device profile 'abacus'"),
     ({"dvfs": {"clients": {"1": {"profile": "abacus"}}}}, "unknown device profile 'abacus'"),
     ({"dvfs": {"clients": {"1": {"frequencies_ghz": [1.0, 40.0]}}}}, "frequencies must lie in [0.01, 10] GHz"),
     ({"dvfs": {"clients": {"1": {"capacitance": -1}}}}, "greater than 0"),
     ({"dvfs": {"clients": {"99": {"cycles_per_sample": 1e6}}}}, "dvfs.clients names clients [99] outside"),
     ({"dvfs": {"policy": "turbo"}}, "'max', 'deadline' or 'slack'"),
     # Accepted before, then every client failed every task: its device report (comm_s 4e298 s) was invalid.
     ({"dvfs": {"link_mbps": 1e-300}}, "greater than or equal to 0.01"),
     ({"dvfs": {"clients": {"1": {"link_mbps": 1e-300}}}}, "greater than or equal to 0.01"),
     ({"dvfs": {"clients": {"1": {"cycles_per_sample": 1e12, "capacitance": 1e-20, "frequencies_ghz": [10.0]}}}},
      "client 1's device (rpi4*, "),
     # Accepted before; then every cloud update of the run failed ("cannot be converted to type float").
     ({"algorithm": "hfpl", "params": {"classifier_lr": 1e308}}, "less than or equal to 1000"),
     # A 40 GB model: the cloud tried to allocate it and answered 500.
     ({"model": {"name": "mlp", "hidden": [100_000, 100_000]}}, "the run's global state would take 38176 MiB")],
    ids=["algorithm-params", "edges-without-clients", "sync-buffer", "zero-fraction", "npz-without-path",
         "dvfs-unknown-profile", "dvfs-unknown-profile-in-list", "dvfs-unknown-profile-override",
         "dvfs-frequency-out-of-range", "dvfs-negative-capacitance", "dvfs-override-of-a-stranger",
         "dvfs-unknown-policy", "dvfs-link-too-slow", "dvfs-override-link-too-slow", "dvfs-device-beyond-a-report",
         "hfpl-classifier-lr-beyond-float32", "mlp-beyond-the-state-limit"],
)
async def test_create_run_inconsistent_config(cloud: Cloud, overrides: dict[str, Any], fragment: str) -> None:
    before = await cloud.snapshot()
    r = await cloud.admin("POST", "/api/v1/runs", json=small_config(**overrides))
    detail_of(r, 422, fragment)
    assert await cloud.snapshot() == before


# Robust aggregation and DP-FedAvg: what their algorithm or the round's size cannot honour.
# small_config: 4 clients, one edge, every client every round.
ROBUST_OR_PRIVATE = {
    "robust-scaffold": ({"algorithm": "scaffold", "aggregation": {"edge": "median"}},
                        "scaffold does not support robust aggregation"),
    "private-fedsgd": ({"algorithm": "fedsgd", "weighting": "uniform", "privacy": {"noise": "edge"}},
                       "fedsgd does not support differential privacy"),
    "unknown-aggregator": ({"aggregation": {"edge": "geomed"}}, "'mean', 'median', 'trimmed_mean' or 'krum'"),
    "krum-too-few": ({"aggregation": {"edge": "krum", "krum_byzantine": 1}}, "krum needs at least 2f + 3 = 5"),
    "multi-krum-too-many": ({"data": {"dataset": "digits", "num_clients": 6},
                             "aggregation": {"edge": "krum", "krum_byzantine": 1, "krum_selected": 6}},
                            "multi-Krum averages at most n - f = 5"),
    "trim-nothing": ({"aggregation": {"edge": "trimmed_mean", "trim_fraction": 0.2}},
                     "floor(trim_fraction * n) = 0 trims nothing"),
    "trim-half": ({"aggregation": {"edge": "trimmed_mean", "trim_fraction": 0.5}}, "less than 0.5"),
    "cloud-median-of-one": ({"aggregation": {"cloud": "median"}}, "the median of fewer than 3 values"),
    "private-by-samples": ({"privacy": {"noise": "edge"}}, "set weighting to 'uniform'"),
    "noise-and-median": ({"weighting": "uniform", "privacy": {"noise": "edge"}, "aggregation": {"edge": "median"}},
                         "needs aggregation.edge 'mean'"),
    "budget-without-noise": ({"privacy": {"epsilon_budget": 3}}, "epsilon_budget needs noise"),
    "budget-below-one-round": ({"weighting": "uniform", "privacy": {"noise": "edge", "epsilon_budget": 0.5}},
                               "is spent before the first round"),
    "zero-noise": ({"weighting": "uniform", "privacy": {"noise": "edge", "noise_multiplier": 0}},
                   "greater than or equal to 0.000001"),
    # Accepted before; then every cloud update failed (the accountant divided by σ² = 0, or gave ε = inf), or
    # with a sampling rate below 1 the accountant never returned (σ = 1e-160).
    "noise-the-accountant-divides-by": (
        {"weighting": "uniform", "privacy": {"noise": "edge", "noise_multiplier": 1e-200}},
        "greater than or equal to 0.000001"),
    "noise-the-accountant-never-accounts-for": (
        {"weighting": "uniform", "fraction": 0.5, "privacy": {"noise": "edge", "noise_multiplier": 1e-160}},
        "greater than or equal to 0.000001"),
    "dp-sgd-noise-the-accountant-divides-by": ({"privacy": {"dp_sgd_noise_multiplier": 1e-300}},
                                               "greater than or equal to 0.000001"),
    # Accepted before; then every noised step was beyond ±1e6 and refused (422), and no round could end.
    "noise-beyond-the-bounds": ({"weighting": "uniform", "privacy": {"noise": "client", "noise_multiplier": 1e4,
                                                                     "clip_norm": 1e6}},
                                "noise_multiplier * clip_norm = 1e+10 carries updates beyond the"),
    # Accepted before, and the history reported epsilon = -2.8.
    "delta-near-one": ({"weighting": "uniform", "privacy": {"noise": "edge", "delta": 1 - 1e-10}},
                       "privacy.delta 1 is too large: epsilon after one round would be -2.8"),
}


@pytest.mark.parametrize("case", ROBUST_OR_PRIVATE)
async def test_create_run_robust_or_private_config_it_cannot_honour(cloud: Cloud, case: str) -> None:
    overrides, fragment = ROBUST_OR_PRIVATE[case]
    before = await cloud.snapshot()
    r = await cloud.admin("POST", "/api/v1/runs", json=small_config(**overrides))
    detail_of(r, 422, fragment)
    assert await cloud.snapshot() == before


async def test_create_run_missing_data_file(cloud: Cloud, tmp_path) -> None:
    before = await cloud.snapshot()
    config = small_config(data={"dataset": "npz", "path": str(tmp_path / "absent.npz"), "num_clients": 4})
    r = await cloud.admin("POST", "/api/v1/runs", json=config)
    detail_of(r, 422, "cannot load the run's data")
    assert await cloud.snapshot() == before


@pytest.mark.filterwarnings("ignore:Initializing zero-element tensors")  # the 2x2 CNN, refused right after
@pytest.mark.parametrize("case", ["npy-not-npz", "cnn-on-2x2-images"])
async def test_create_run_data_the_model_cannot_take(cloud: Cloud, tmp_path, case: str) -> None:
    """Refused at creation, not discovered later by every client (a .npy answered 500 before)."""
    x, y = np.random.default_rng(0).random((40, 1, 2, 2), dtype=np.float32), np.arange(40) % 3
    if case == "npy-not-npz":
        path, model, fragment = tmp_path / "x.npy", "logreg", "is not an npz archive"
        np.save(path, x)
    else:
        path, model, fragment = tmp_path / "tiny.npz", "cnn", "the model 'cnn' does not fit the data's samples"
        np.savez(path, x_train=x, y_train=y, x_test=x[:5], y_test=y[:5])
    before = await cloud.snapshot()
    config = small_config(model={"name": model}, data={"dataset": "npz", "path": str(path), "num_clients": 4})
    r = await cloud.admin("POST", "/api/v1/runs", json=config)
    detail_of(r, 422, fragment)
    assert await cloud.snapshot() == before


# FedVARP keeps, and sends, a copy of the model per client: 6 logreg copies take 15.6 kB. Against a smaller
# limit, creation refuses the run; with fewer clients (or fewer a round) it fits. Before the payload check,
# such a run was created and every contribution answered 413: stalled at version 0 for good.
CREATION_LIMITS = {
    "server-memory": ({"max_state_bytes": 10_000}, "the run's server memory would take", "FL_CLOUD_MAX_STATE_BYTES",
                      {"data": {"dataset": "digits", "num_clients": 3}}),
    "contribution": ({"max_payload_bytes": 12_000}, "an edge's contribution would take up to",
                     "FL_CLOUD_MAX_PAYLOAD_BYTES", {"fraction": 0.5}),
}


@pytest.mark.parametrize("limit", CREATION_LIMITS)
async def test_create_run_beyond_a_size_limit(redis_url: str, limit: str) -> None:
    settings, fragment, setting, fitting = CREATION_LIMITS[limit]
    async with running_cloud(redis_url, **settings) as cloud:
        before = await cloud.snapshot()
        config = small_config(algorithm="fedvarp", data={"dataset": "digits", "num_clients": 6})
        r = await cloud.admin("POST", "/api/v1/runs", json=config)
        detail_of(r, 422, fragment, setting)
        assert await cloud.snapshot() == before
        r = await cloud.admin("POST", "/api/v1/runs", json={**config, **fitting})
        assert r.status_code == 201, r.text


@pytest.mark.parametrize(
    ("method", "suffix"),
    [("GET", ""), ("POST", "/start"), ("POST", "/pause"), ("POST", "/resume"), ("POST", "/stop"),
     ("GET", "/history"), ("GET", "/model")],
    ids=["get", "start", "pause", "resume", "stop", "history", "model"],
)
async def test_unknown_run_id(cloud: Cloud, method: str, suffix: str) -> None:
    run_id = await cloud.create_run()
    before = await cloud.snapshot(run_id)
    r = await cloud.admin(method, f"/api/v1/runs/{UNKNOWN_RUN}{suffix}")
    assert detail_of(r, 404) == f"unknown run {UNKNOWN_RUN!r}"
    assert await cloud.snapshot(run_id) == before


@pytest.mark.parametrize(("method", "suffix", "code"), [("POST", "/restart", 404), ("POST", "/start/now", 404),
                                                     ("POST", "/history", 405), ("GET", "/start", 405)],
                         ids=["unknown-action", "deeper", "not-an-action", "get-an-action"])
async def test_unknown_action(cloud: Cloud, method: str, suffix: str, code: int) -> None:
    """An action that does not exist is a path that does not exist (404), or one that takes another method (405):
    not an invalid parameter (422)."""
    run_id = await cloud.create_run()
    before = await cloud.snapshot(run_id)
    r = await cloud.admin(method, f"/api/v1/runs/{run_id}{suffix}")
    assert r.status_code == code, r.text
    assert await cloud.snapshot(run_id) == before


async def test_binary_answers_are_documented_as_what_they_are(cloud: Cloud) -> None:
    """The model download, an edge's global state: safetensors, as the OpenAPI says (not JSON of any shape)."""
    paths = (await cloud.http.get("/openapi.json")).json()["paths"]
    for path in ("/api/v1/runs/{run_id}/model", "/api/v1/edges/{edge_id}/global"):
        assert list(paths[path]["get"]["responses"]["200"]["content"]) == [SAFETENSORS], path
    run_id = await cloud.create_run()
    r = await cloud.admin("GET", f"/api/v1/runs/{run_id}/model")
    assert r.status_code == 200 and r.headers["content-type"] == SAFETENSORS


async def _run_in(cloud: Cloud, status: str) -> str:
    run_id = await cloud.create_run()
    path = {"created": [], "running": ["start"], "paused": ["start", "pause"], "stopped": ["stop"]}[status]
    for action in path:
        await cloud.action(run_id, action)
    assert (await cloud.info(run_id))["status"] == status
    return run_id


@pytest.mark.parametrize(
    ("status", "action"),
    [("created", "pause"), ("created", "resume"), ("running", "resume"), ("running", "start"),
     ("paused", "pause"), ("paused", "start"), ("stopped", "start"), ("stopped", "resume"),
     ("stopped", "pause"), ("stopped", "stop")],
)
async def test_invalid_transition(cloud: Cloud, status: str, action: str) -> None:
    run_id = await _run_in(cloud, status)
    before = await cloud.snapshot(run_id)
    r = await cloud.admin("POST", f"/api/v1/runs/{run_id}/{action}")
    assert detail_of(r, 409) == f"cannot {action} a run that is {status}"
    assert await cloud.snapshot(run_id) == before


# =================================================================================================
# Edge API (edge token)
# =================================================================================================
EDGE_ENDPOINTS = [
    ("POST", "/api/v1/edges"),
    ("GET", "/api/v1/edges/0/global"),
    ("POST", "/api/v1/edges/0/contributions"),
]


@pytest.mark.parametrize(
    ("token", "expected"),
    [(None, "missing bearer token"), ("not-the-edge-token", "invalid bearer token"),
     (ADMIN_TOKEN, "invalid bearer token")],
    ids=["missing-token", "wrong-token", "admin-token"],
)
@pytest.mark.parametrize(("method", "path"), EDGE_ENDPOINTS, ids=[f"{m} {p[7:]}" for m, p in EDGE_ENDPOINTS])
async def test_edge_api_refuses_bad_tokens(cloud: Cloud, method: str, path: str, token: str | None,
                                           expected: str) -> None:
    run_id, global_ = await running_run(cloud)
    before = await cloud.snapshot(run_id)
    kwargs: dict[str, Any] = {}
    if path.endswith("/edges"):
        kwargs = {"json": {"edge_id": 1}}
    elif path.endswith("/contributions"):
        kwargs = {"content": contribution(global_, run_id), "headers": {"Content-Type": SAFETENSORS}}
    else:
        kwargs = {"params": {"timeout": 0}}
    r = await cloud.edge(method, path, token=token, **kwargs)
    assert detail_of(r, 401) == expected
    assert await cloud.snapshot(run_id) == before


@pytest.mark.parametrize(
    ("body", "fragment"),
    [({}, "missing"), ({"edge_id": -1}, "greater than or equal to 0"), ({"edge_id": 2**31}, "less than or equal"),
     ({"edge_id": "zero"}, "valid integer"), ({"edge_id": False}, "valid integer"),
     ({"edge_id": "0"}, "valid integer"), ({"edge_id": 0, "devices": True}, "valid integer"),
     ({"edge_id": 0, "token": "x"}, "Extra inputs are not permitted"),
     ({"edge_id": 0, "url": "x" * 501}, "at most 500 characters"), (b'{"edge_id": 0', "JSON decode error"),
     ([0], "valid dictionary")],
    ids=["missing-edge-id", "negative", "too-large", "string", "boolean", "numeral", "boolean-devices", "extra-key",
         "long-url", "malformed-json", "array"],
)
async def test_register_edge_bad_body(cloud: Cloud, body: Any, fragment: str) -> None:
    await cloud.register_edge(0)
    before = await cloud.snapshot()
    if isinstance(body, bytes):
        r = await cloud.edge("POST", "/api/v1/edges", content=body, headers={"Content-Type": "application/json"})
    else:
        r = await cloud.edge("POST", "/api/v1/edges", json=body)
    detail = detail_of(r, 422, fragment)
    assert all(e["loc"][0] == "body" for e in detail)
    assert await cloud.snapshot() == before


async def test_long_poll_unregistered_edge(cloud: Cloud) -> None:
    run_id, _ = await running_run(cloud)
    before = await cloud.snapshot(run_id)
    r = await cloud.edge("GET", "/api/v1/edges/7/global", params={"timeout": 0})
    assert detail_of(r, 404) == "unknown edge 7; register first"
    assert await cloud.snapshot(run_id) == before


@pytest.mark.parametrize(
    ("params", "loc"),
    [({"after": -2}, "after"), ({"timeout": -1}, "timeout"), ({"after": "latest"}, "after"),
     ({"timeout": "nan"}, "timeout")],
    ids=["after-below-minus-one", "negative-timeout", "after-not-int", "timeout-nan"],
)
async def test_long_poll_bad_query(cloud: Cloud, params: dict[str, Any], loc: str) -> None:
    run_id, _ = await running_run(cloud)
    before = await cloud.snapshot(run_id)
    r = await cloud.edge("GET", "/api/v1/edges/0/global", params={"timeout": 0, **params})
    detail = detail_of(r, 422)
    assert [e["loc"] for e in detail] == [["query", loc]], detail
    assert await cloud.snapshot(run_id) == before


# ---- contributions ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("token", "expected"),
    [(None, "missing bearer token"), ("not-the-edge-token", "invalid bearer token")],
    ids=["missing-token", "wrong-token"],
)
async def test_contribution_bad_token(cloud: Cloud, token: str | None, expected: str) -> None:
    run_id, global_ = await running_run(cloud)
    before = await cloud.snapshot(run_id)
    r = await cloud.submit(0, contribution(global_, run_id), token=token)
    assert detail_of(r, 401) == expected
    assert await cloud.snapshot(run_id) == before


NOT_SAFETENSORS = not_safetensors(
    encode({"w": torch.zeros(3, dtype=torch.float64)},
           contribution_header("r", clients=[ClientParticipation(client_id=0, num_samples=1, loss=0.0)])),
    json_body=b'{"run_id": "x", "edge_id": 0}')


@pytest.mark.parametrize("case", NOT_SAFETENSORS)
async def test_contribution_not_safetensors(cloud: Cloud, case: str) -> None:
    body, fragment = NOT_SAFETENSORS[case]
    run_id, _ = await running_run(cloud)
    before = await cloud.snapshot(run_id)
    r = await cloud.submit(0, body)
    detail_of(r, 400, fragment)
    assert await cloud.snapshot(run_id) == before


async def test_contribution_without_message_metadata(cloud: Cloud) -> None:
    run_id, global_ = await running_run(cloud)
    before = await cloud.snapshot(run_id)
    for body in (encode(zeros_like(global_)), st_save(zeros_like(global_), metadata={"other": "x"})):
        r = await cloud.submit(0, body)
        assert detail_of(r, 400) == "safetensors metadata has no 'message' header"
    assert await cloud.snapshot(run_id) == before


def _header_dict(run: str, **changes: Any) -> dict[str, Any]:
    fields = contribution_header(run).model_dump(mode="json")
    for key, value in changes.items():
        if value is ...:
            fields.pop(key)
        else:
            fields[key] = value
    return fields


INVALID_HEADERS = {
    "weight-zero": ({"weight": 0}, "weight"),
    "weight-negative": ({"weight": -1.0}, "weight"),
    "weight-nan": ({"weight": float("nan")}, "weight"),
    "weight-inf": ({"weight": float("inf")}, "weight"),
    "missing-idempotency-key": ({"idempotency_key": ...}, "idempotency_key"),
    "missing-clients": ({"clients": ...}, "clients"),
    "empty-clients": ({"clients": []}, "clients"),
    "missing-run-id": ({"run_id": ...}, "run_id"),
    "negative-base-version": ({"base_version": -1}, "base_version"),
    "negative-edge-id": ({"edge_id": -1}, "edge_id"),
    "extra-field": ({"signature": "x"}, "signature"),
    "bad-client": ({"clients": [{"client_id": 0, "num_samples": -5, "loss": 0.1}]}, "num_samples"),
    "client-without-samples": ({"clients": [{"client_id": 0, "num_samples": 0, "loss": 0.1}]}, "num_samples"),
    # Finite, yet the round's sample-weighted mean loss would overflow to -inf.
    "client-huge-loss": ({"clients": [{"client_id": 0, "num_samples": 10, "loss": -1e300}]}, "loss"),
    "client-huge-metric": ({"clients": [{"client_id": 0, "num_samples": 10, "loss": 0.1,
                                         "metrics": {"accuracy": 1e300}}]}, "accuracy"),
}


@pytest.mark.parametrize("case", [*INVALID_HEADERS, "not-json"])
async def test_contribution_invalid_header(cloud: Cloud, case: str) -> None:
    run_id, global_ = await running_run(cloud)
    if case == "not-json":
        message, fragment = "{not json", "json_invalid"
    else:
        changes, fragment = INVALID_HEADERS[case]
        message = _header_dict(run_id, **changes)
    before = await cloud.snapshot(run_id)
    r = await cloud.submit(0, raw_message(zeros_like(global_), message))
    detail_of(r, 422, "invalid EdgeContributionHeader", fragment)
    assert await cloud.snapshot(run_id) == before


@pytest.mark.parametrize("loss", [float("nan"), float("inf"), float("-inf")], ids=["nan", "inf", "-inf"])
async def test_contribution_non_finite_client_loss(cloud: Cloud, loss: float) -> None:
    run_id, global_ = await running_run(cloud)
    before = await cloud.snapshot(run_id)
    message = _header_dict(run_id, clients=[{"client_id": 0, "num_samples": 10, "loss": loss}])
    r = await cloud.submit(0, raw_message(zeros_like(global_), message))
    detail_of(r, 422, "invalid EdgeContributionHeader", "loss")
    assert await cloud.snapshot(run_id) == before


async def test_contribution_edge_id_differs_from_url(cloud: Cloud) -> None:
    run_id, global_ = await running_run(cloud, two_edge_config(), edges=(0, 1))
    before = await cloud.snapshot(run_id)
    r = await cloud.submit(1, contribution(global_, run_id, edge_id=0))
    assert detail_of(r, 422) == "header edge_id 0 does not match the URL's 1"
    assert await cloud.snapshot(run_id) == before


async def test_contribution_unknown_run(cloud: Cloud) -> None:
    run_id, global_ = await running_run(cloud)
    before = await cloud.snapshot(run_id)
    r = await cloud.submit(0, contribution(global_, UNKNOWN_RUN))
    assert detail_of(r, 404) == f"unknown run {UNKNOWN_RUN!r}"
    assert await cloud.snapshot(run_id) == before
    assert not [k async for k in cloud.redis.scan_iter(match=f"{cloud.prefix}:run:{UNKNOWN_RUN}:*")]


async def test_contribution_unregistered_edge(cloud: Cloud) -> None:
    run_id, global_ = await running_run(cloud, two_edge_config())  # only edge 0 registered
    before = await cloud.snapshot(run_id)
    r = await cloud.submit(1, contribution(global_, run_id, edge_id=1))
    assert detail_of(r, 404) == "unknown edge 1; register first"
    assert await cloud.snapshot(run_id) == before


@pytest.mark.parametrize("edge_id", [1, 2**31 - 1])
async def test_contribution_edge_outside_run(cloud: Cloud, edge_id: int) -> None:
    run_id, global_ = await running_run(cloud, edges=(0, edge_id))  # a one-edge run
    before = await cloud.snapshot(run_id)
    r = await cloud.submit(edge_id, contribution(global_, run_id, edge_id=edge_id))
    assert detail_of(r, 422) == f"edge {edge_id} is not part of this run (1 edges)"
    assert await cloud.snapshot(run_id) == before


def _one_client(samples: int = 10) -> list[ClientParticipation]:
    return [ClientParticipation(client_id=0, num_samples=samples, loss=0.5)]


# What an edge could not have computed from its clients; each passed the header's own validation.
INADMISSIBLE = {
    # Ordinary sums under a tiny weight: their mean, the next model, would be inf in float32.
    "weight-tiny": (dict(weight=1e-300), None, "weight 1e-300 is not one its clients give: expected between 10"),
    "weight-beyond-its-clients": (dict(weight=11.0), None, "weight 11 is not one its clients give"),
    "client-twice": (dict(clients=_one_client(5) * 2), None,
                     "a client appears at most once per edge round (1); more often: [0]"),
    "huge-values": ({}, 1e30, "values beyond"),
    "mean-beyond-bound": ({}, 1e6 * 10 * 1.01, "values beyond"),  # sums / weight 10 just above 1e6
}


@pytest.mark.parametrize("case", INADMISSIBLE)
async def test_contribution_inadmissible(cloud: Cloud, case: str) -> None:
    run_id, global_ = await running_run(cloud)
    header, value, fragment = INADMISSIBLE[case]
    tensors = zeros_like(global_)
    if value is not None:
        tensors = {name: torch.full_like(t, value) for name, t in tensors.items()}
    before = await cloud.snapshot(run_id)
    r = await cloud.submit(0, encode(tensors, contribution_header(run_id, **header)))
    assert fragment in detail_of(r, 422)
    assert await cloud.snapshot(run_id) == before


async def test_contribution_mean_at_the_bound_accepted(cloud: Cloud) -> None:
    run_id, global_ = await running_run(cloud)
    tensors = {name: torch.full_like(t, 1e6 * 10) for name, t in zeros_like(global_).items()}
    r = await cloud.submit(0, encode(tensors, contribution_header(run_id)))
    assert r.status_code == 202, r.text


def _wrong_tensors(global_: Tensors, case: str) -> tuple[Tensors, str]:
    good = zeros_like(global_)
    name = max(sorted(good), key=lambda k: good[k].dim())  # a matrix, so flattening changes the shape
    if case == "missing-tensor":
        return {k: v for k, v in good.items() if k != name}, f"missing [{name!r}], unexpected []"
    if case == "renamed-tensor":
        renamed = {("model/renamed" if k == name else k): v for k, v in good.items()}
        return renamed, f"missing [{name!r}], unexpected ['model/renamed']"
    if case == "extra-tensor":
        bonus = torch.zeros(1, dtype=torch.float32)
        return {**good, "model/bonus": bonus}, "missing [], unexpected ['model/bonus']"
    if case == "ungrouped-tensor":  # the record codec refuses it before any algorithm sees it
        return {**good, "bonus": torch.zeros(1, dtype=torch.float32)}, "tensor 'bonus' names no group"
    if case == "wrong-shape":
        shape = list(good[name].shape)
        longer = {**good, name: torch.zeros(shape + [1], dtype=torch.float32)}
        return longer, f"has shape {shape + [1]}, expected {shape}"
    if case == "transposed":
        t = good[name]
        return {**good, name: torch.zeros(t.numel(), dtype=torch.float32)}, f"has shape [{t.numel()}]"
    if case == "float64":  # the sums travel as float32 (Algorithm.wire_spec)
        return zeros_like(global_, torch.float64), "has dtype torch.float64, expected torch.float32"
    if case == "int64":
        return {**good, name: torch.zeros(good[name].shape, dtype=torch.int64)}, "has dtype torch.int64"
    value = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}[case]
    bad = good[name].clone().reshape(-1)
    bad[-1] = value
    return {**good, name: bad.reshape(good[name].shape)}, f"tensor {name!r} contains NaN or Inf"


@pytest.mark.parametrize(
    "case", ["missing-tensor", "renamed-tensor", "extra-tensor", "ungrouped-tensor", "wrong-shape", "transposed",
             "float64", "int64", "nan", "inf", "-inf"],
)
async def test_contribution_wrong_tensors(cloud: Cloud, case: str) -> None:
    run_id, global_ = await running_run(cloud)
    tensors, fragment = _wrong_tensors(global_, case)
    before = await cloud.snapshot(run_id)
    r = await cloud.submit(0, encode(tensors, contribution_header(run_id)))
    detail_of(r, 422, fragment)
    assert await cloud.snapshot(run_id) == before
    # The refusal does not burn the edge's slot: the correct contribution is still accepted.
    ok = await cloud.submit(0, contribution(global_, run_id))
    assert ok.status_code == 202, ok.text


PAYLOAD_LIMIT = 20_000  # small_config's logreg contributions take 5.3 kB


@pytest.mark.parametrize("length", OVERSIZED.values(), ids=OVERSIZED.keys())
async def test_contribution_oversized(redis_url: str, length: str) -> None:
    # The limit admits the run's contributions (or it could not be created); this one carries padding.
    async with running_cloud(redis_url, max_payload_bytes=PAYLOAD_LIMIT) as cloud:
        run_id, global_ = await running_run(cloud)
        before = await cloud.snapshot(run_id)
        padded = raw_message(zeros_like(global_), contribution_header(run_id).model_dump_json() + " " * PAYLOAD_LIMIT)
        await assert_refuses_oversized(partial(cloud.submit, 0), padded, length, PAYLOAD_LIMIT)
        assert await cloud.snapshot(run_id) == before


@pytest.mark.parametrize("length", OVERSIZED.values(), ids=OVERSIZED.keys())
@pytest.mark.parametrize("endpoint", ["create-run", "register-edge"])
async def test_json_body_oversized(redis_url: str, endpoint: str, length: str) -> None:
    """The payload limit covers the JSON routes too (valid JSON, padded past the limit)."""
    async with running_cloud(redis_url, max_payload_bytes=PAYLOAD_LIMIT) as cloud:
        run_id = await cloud.create_run()
        before = await cloud.snapshot(run_id)
        path, body, token, model = {
            "create-run": ("/api/v1/runs", small_config(), ADMIN_TOKEN, RunConfig),
            "register-edge": ("/api/v1/edges", {"edge_id": 3}, EDGE_TOKEN, EdgeRegistration),
        }[endpoint]
        blob = json.dumps(body).encode() + b" " * PAYLOAD_LIMIT

        def post(content: Any, headers: dict[str, str] | None = None) -> Awaitable[httpx.Response]:
            return cloud.http.post(path, content=content, headers={
                **bearer(token), "Content-Type": "application/json", **(headers or {})})

        await assert_refuses_oversized(post, blob, length, PAYLOAD_LIMIT, min(PAYLOAD_LIMIT, model.max_body_bytes))
        assert await cloud.snapshot(run_id) == before


async def test_contribution_invalid_content_length(cloud: Cloud) -> None:
    run_id, global_ = await running_run(cloud)
    before = await cloud.snapshot(run_id)
    r = await cloud.submit(0, contribution(global_, run_id), headers={"Content-Length": "lots"})
    assert detail_of(r, 400) == "invalid Content-Length"
    assert await cloud.snapshot(run_id) == before


async def test_contribution_stale_base_version(cloud: Cloud) -> None:
    run_id, global_ = await running_run(cloud)
    first = await cloud.submit(0, contribution(global_, run_id))
    assert first.status_code == 202 and first.json()["accepted"], first.text
    info = await cloud.wait_version(run_id, 1)
    assert (info["status"], info["version"], info["buffered"]) == ("running", 1, 0)
    before = await cloud.snapshot(run_id)
    r = await cloud.submit(0, contribution(global_, run_id, base_version=0, key="a-new-key"))
    assert detail_of(r, 409) == "stale submission: base_version 0, current version 1"
    assert await cloud.snapshot(run_id) == before


@pytest.mark.parametrize("base_version", [1, 10**6])
async def test_contribution_future_base_version(cloud: Cloud, base_version: int) -> None:
    run_id, global_ = await running_run(cloud)
    before = await cloud.snapshot(run_id)
    r = await cloud.submit(0, contribution(global_, run_id, base_version=base_version))
    assert detail_of(r, 409) == f"base_version {base_version} is newer than the run's version 0"
    assert await cloud.snapshot(run_id) == before


async def test_contribution_duplicate_idempotency_key(cloud: Cloud) -> None:
    run_id, global_ = await running_run(cloud, two_edge_config())  # stays buffered: edge 1 never sends
    blob = contribution(global_, run_id)
    first = await cloud.submit(0, blob)
    assert first.status_code == 202, first.text
    assert first.json() == {"accepted": True, "duplicate": False, "buffered": 1}
    before = await cloud.snapshot(run_id)
    again = await cloud.submit(0, blob)
    assert again.status_code == 202, again.text
    assert again.json() == {"accepted": True, "duplicate": True, "buffered": 1}
    assert await cloud.snapshot(run_id) == before
    info = await cloud.info(run_id)
    assert (info["version"], info["buffered"]) == (0, 1)


async def test_contribution_same_slot_other_key(cloud: Cloud) -> None:
    run_id, global_ = await running_run(cloud, two_edge_config())
    first = await cloud.submit(0, contribution(global_, run_id, key="key-1"))
    assert first.status_code == 202, first.text
    before = await cloud.snapshot(run_id)
    r = await cloud.submit(0, contribution(global_, run_id, key="key-2"))
    assert detail_of(r, 409) == "edge 0 already submitted for version 0 under another idempotency key"
    assert await cloud.snapshot(run_id) == before


async def test_contribution_key_of_another_edge_refused(cloud: Cloud) -> None:
    """A key already used by edge 0 is not a retry of edge 1's submission: 409, not a silent 'duplicate'
    that dropped edge 1's contribution and stalled the synchronous round."""
    run_id, global_ = await running_run(cloud, two_edge_config(), edges=(0, 1))
    assert (await cloud.submit(0, contribution(global_, run_id, key="shared"))).status_code == 202
    before = await cloud.snapshot(run_id)
    r = await cloud.submit(1, contribution(global_, run_id, edge_id=1, key="shared"))
    assert "idempotency key 'shared' was used for another contribution" in detail_of(r, 409)
    assert await cloud.snapshot(run_id) == before


async def test_contribution_key_of_an_earlier_version_refused(cloud: Cloud) -> None:
    run_id, global_ = await running_run(cloud)  # one edge, B = 1: each submit makes a version
    assert (await cloud.submit(0, contribution(global_, run_id, key="k"))).status_code == 202
    await cloud.wait_version(run_id, 1)
    before = await cloud.snapshot(run_id)
    r = await cloud.submit(0, contribution(global_, run_id, base_version=1, key="k"))
    assert "was used for another contribution" in detail_of(r, 409)
    assert await cloud.snapshot(run_id) == before


@pytest.mark.parametrize("status", ["created", "stopped"])
async def test_contribution_run_not_running(cloud: Cloud, status: str) -> None:
    active, global_ = await running_run(cloud)  # the state an edge would have fetched
    if status == "created":
        run_id = await cloud.create_run()
    else:
        await cloud.action(active, "stop")
        run_id = active
    before = await cloud.snapshot(run_id)
    r = await cloud.submit(0, contribution(global_, run_id))
    assert detail_of(r, 409) == f"run is {status}, not accepting contributions"
    assert await cloud.snapshot(run_id) == before


# =================================================================================================
# Regression (found with this suite, fixed in c5a778b): on Python 3.11 asyncio.wait_for swallowed a
# cancel that arrived in the loop turn the wake event fired, so the cloud's shutdown hung forever.
# =================================================================================================
async def test_orchestrator_stops_when_cancelled_right_after_a_wake_up(redis_url: str) -> None:
    from fl_services.cloud.orchestrator import Orchestrator
    from fl_services.cloud.storage.redis import Keys, RedisStore

    redis = aioredis.Redis.from_url(redis_url)
    hung = []
    try:
        for yields in range(2):
            orchestrator = Orchestrator(RedisStore(redis, Keys(f"test-{uuid.uuid4().hex}")))
            task = asyncio.create_task(orchestrator.run_forever())
            await asyncio.sleep(0.05)  # now idle in wait_for(wake.wait(), 1.0)
            orchestrator.notify()  # what every contribution and control action does
            for _ in range(yields):
                await asyncio.sleep(0)
            task.cancel()  # what the lifespan does on shutdown
            done, _ = await asyncio.wait({task}, timeout=1.0)
            if not done:
                hung.append(yields)
                task.cancel()  # a second cancel gets through; do not leave the loop behind
                await asyncio.wait({task}, timeout=5)
    finally:
        await redis.aclose()
    assert not hung, f"run_forever ignored cancel() issued {hung} loop turns after notify()"


async def test_cloud_shutdown_survives_a_cancel_during_a_redis_command(redis_url: str) -> None:
    from fl_services.cloud.orchestrator import Orchestrator

    async with running_cloud(redis_url) as cloud:
        await running_run(cloud)  # an active run: every step issues several Redis commands
        for yields in range(40):
            orchestrator = Orchestrator(cloud.app.state.store)  # a second loop, cancelled as the lifespan does
            task = asyncio.create_task(orchestrator.run_forever())
            await asyncio.sleep(0.02)
            orchestrator.notify()  # a contribution or control action arrived: step() talks to Redis
            for _ in range(yields):
                await asyncio.sleep(0)
            orchestrator.stop()  # what the lifespan does before it cancels
            task.cancel()
            done, _ = await asyncio.wait({task}, timeout=1.5)
            if not done:
                task.cancel()  # a second cancel gets through; do not leave the loop behind
                await asyncio.wait({task}, timeout=5)
            assert done, f"run_forever ignored cancel() issued {yields} loop turns after notify()"


async def test_a_loader_that_never_returns_is_refused_in_time_and_holds_nothing(redis_url: str) -> None:
    # More hung creations than asyncio's shared thread pool has workers (min(32, cpus + 4)): each is refused
    # at the time limit, and the threads that decode every contribution stay free for the runs that train.
    hung = small_config(data={"dataset": "tests.shared.user_factories:hangs", "num_clients": 4})
    try:
        async with running_cloud(redis_url, create_timeout_s=0.5) as cloud:
            answers = await asyncio.wait_for(asyncio.gather(*[
                cloud.admin("POST", "/api/v1/runs", json=hung) for _ in range(min(32, (os.cpu_count() or 1) + 4) + 1)
            ]), 20)
            assert {r.status_code for r in answers} == {422}
            assert "did not finish in 0.5 s" in answers[0].json()["detail"]
            assert (await cloud.admin("GET", "/api/v1/runs")).json() == []
            run_id, global_ = await asyncio.wait_for(running_run(cloud), 20)
            assert (await asyncio.wait_for(cloud.submit(0, contribution(global_, run_id)), 20)).status_code == 202
    finally:
        user_factories.RELEASE.set()


# =================================================================================================
# Large inputs: refused by what the route needs, and never echoed back whole
# =================================================================================================
@pytest.mark.parametrize("endpoint", ["create-run", "register-edge"])
async def test_a_json_body_is_refused_past_what_its_route_needs(cloud: Cloud, endpoint: str) -> None:
    path, body, token, limit = {
        "create-run": ("/api/v1/runs", small_config(), ADMIN_TOKEN, RunConfig.max_body_bytes),
        "register-edge": ("/api/v1/edges", {"edge_id": 3}, EDGE_TOKEN, EdgeRegistration.max_body_bytes),
    }[endpoint]
    blob = json.dumps(body).encode() + b" " * limit
    r = await cloud.http.post(path, content=blob, headers={**bearer(token), "Content-Type": "application/json"})
    assert detail_of(r, 413) == f"payload of {len(blob)} bytes exceeds the limit of {limit}"
    assert (await cloud.admin("GET", "/api/v1/runs")).json() == []


async def test_a_422_quotes_a_large_run_config_only_briefly(cloud: Cloud) -> None:
    """A 900 kB config with a field it should not have, and many more: the 422 names the first few
    without echoing the config (a 60 MB one took 59 s to be written back)."""
    config = {**small_config(), "notes": "x" * 900_000, **{f"also{i}": i for i in range(100)}}
    r = await cloud.admin("POST", "/api/v1/runs", json=config)
    detail = detail_of(r, 422, "notes", "Extra inputs are not permitted", "more not shown")
    assert len(r.content) < 6000, len(r.content)
    assert len(detail) == 21


async def test_contributions_past_the_rate_limit_get_429_per_edge(redis_url: str) -> None:
    async with running_cloud(redis_url, rate_limit="2/minute") as cloud:
        statuses = [(await cloud.submit(0, b"not safetensors")).status_code for _ in range(3)]
        assert statuses == [400, 400, 429]
        assert (await cloud.submit(1, b"not safetensors")).status_code == 400  # another edge: its own allowance


async def test_an_upload_the_edge_gives_up_is_no_server_error(cloud: Cloud) -> None:
    """An edge drops its contribution's upload when the run stops (it cancels the round): the cloud answered
    500 and logged "Exception in ASGI application" with a traceback (starlette's ClientDisconnect)."""
    await cloud.register_edge(0)
    received = iter([{"type": "http.request", "body": b"x" * 100, "more_body": True}])
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return next(received, {"type": "http.disconnect"})

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    path = "/api/v1/edges/0/contributions"
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
             "client": ("127.0.0.1", 50000), "server": ("127.0.0.1", 8000), "state": {},
             "headers": [(b"authorization", f"Bearer {EDGE_TOKEN}".encode()), (b"content-type", SAFETENSORS.encode()),
                         (b"content-length", b"1000")]}
    await cloud.app(scope, receive, send)  # raised ClientDisconnect before, after sending a 500
    assert [m["status"] for m in sent if m["type"] == "http.response.start"] == [400]
