"""The run configuration: everything that determines a training run's result.

A `RunConfig` is what an administrator POSTs to the cloud and what the in-process reference
runner takes; the same config and seed give the same global model either way.
"""
from __future__ import annotations

import json
import math
import re
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue, field_validator, model_validator


class Strict(BaseModel):
    # A typo in a config key must be an error, not a silently ignored option. JSON's 1e400 parses to inf,
    # which would be stored as null and make the run unreadable: every float must be finite.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


MAX_SYNTHETIC_DEVICES = 1000


BUILTIN_DATASETS = ("mnist5k", "digits", "npz", "synthetic", "mnist1d")
BUILTIN_MODELS = ("logreg", "mlp", "cnn")
# "package.module:attribute": user code the services import (see shared.user_code).
IMPORT_PATH = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$")


def is_import_path(name: str) -> bool:
    return IMPORT_PATH.fullmatch(name) is not None


def _builtin_or_import_path(name: str, builtins: tuple[str, ...], what: str) -> str:
    if name not in builtins and not is_import_path(name):
        raise ValueError(f"{what} must be one of {', '.join(builtins)} or an import path "
                         f"'package.module:function', got {name!r}")
    return name


def _check_json(options: dict[str, Any], where: str) -> None:
    # JSON's 1e400 parses to inf, which would be stored as null: options must survive a round trip.
    try:
        json.dumps(options, allow_nan=False)
    except ValueError as exc:
        raise ValueError(f"{where} must hold finite numbers: {exc}") from exc


class _HashableOptions(Strict):
    """A config holding an `options` dict: its hash (the data/model caches key on configs) goes through
    its canonical JSON, since a frozen pydantic model would hash the unhashable dict itself."""

    def __hash__(self) -> int:
        return hash(json.dumps(self.model_dump(mode="json"), sort_keys=True))


class DataConfig(_HashableOptions):
    dataset: str = Field("mnist5k", description="mnist5k | digits | npz | synthetic | mnist1d, or "
                         "'package.module:load', a loader function called as load(**options)")
    # Only for dataset="npz": a file with x_train, y_train, client_train, x_test, y_test.
    path: str | None = None
    options: dict[str, JsonValue] = Field(
        default_factory=dict, description="keyword arguments of an imported loader (JSON values)")
    partition: Literal["iid", "dirichlet", "shards", "file", "natural"] = Field(
        "iid", description="iid | dirichlet | shards | file: the client index stored with the data (an npz's or "
        "an imported loader's client_train) | natural: the synthetic generator's own devices")
    alpha: float = Field(0.5, gt=0, description="Dirichlet concentration (partition='dirichlet')")
    shards_per_client: int = Field(2, ge=1)
    num_clients: int = Field(10, ge=1, le=100_000)
    # FedProx's Synthetic(α, β): α controls how much local models differ, β how much local data differ.
    synthetic_alpha: float = Field(1.0, ge=0, le=100)
    synthetic_beta: float = Field(1.0, ge=0, le=100)
    test_fraction: float = Field(0.2, gt=0, lt=1, description="held-out share of the pooled data")
    client_holdout: float = Field(
        0.2, ge=0, lt=1, description="share of each client's rows held out as its own test split (personalised "
        "evaluation), whatever the partition; training and the weights p_k use the rest; 0: every row trains")

    @field_validator("dataset")
    @classmethod
    def _dataset_name(cls, name: str) -> str:
        return _builtin_or_import_path(name, BUILTIN_DATASETS, "data.dataset")

    @model_validator(mode="after")
    def _check(self) -> "DataConfig":
        if self.dataset == "npz" and not self.path:
            raise ValueError("dataset 'npz' needs a path")
        if self.options and not is_import_path(self.dataset):
            raise ValueError("data.options are the keyword arguments of an imported loader "
                             "(dataset = 'package.module:load')")
        _check_json(self.options, "data.options")
        if self.partition == "file" and not (self.dataset == "npz" or is_import_path(self.dataset)):
            raise ValueError("partition 'file' uses the client index stored with the data "
                             "(an npz dataset or an imported loader)")
        if self.partition == "natural" and self.dataset != "synthetic":
            raise ValueError("partition 'natural' is the synthetic generator's own devices")
        if self.partition == "natural" and self.client_holdout == 0:
            # Its global test set is the union of the devices' held-out splits.
            raise ValueError("partition 'natural' tests on the devices' held-out rows: client_holdout must be above 0")
        if self.dataset == "synthetic" and self.num_clients > MAX_SYNTHETIC_DEVICES:
            # Its data grows with the devices (≈ 0.7 GB at 1000, held by the cloud and every process).
            raise ValueError(f"synthetic generates its data per device: at most {MAX_SYNTHETIC_DEVICES} clients")
        return self


class ModelConfig(_HashableOptions):
    name: str = Field("cnn", description="logreg | mlp | cnn, or 'package.module:factory', a function called as "
                      "factory(input_shape, num_classes, **options) that returns a torch nn.Module")
    hidden: tuple[int, ...] = Field(
        (200, 200), min_length=1, max_length=16, description="the mlp's hidden layer sizes (McMahan's 2NN: 200, 200)")
    options: dict[str, JsonValue] = Field(
        default_factory=dict, description="keyword arguments of an imported factory (JSON values)")

    @field_validator("name")
    @classmethod
    def _model_name(cls, name: str) -> str:
        return _builtin_or_import_path(name, BUILTIN_MODELS, "model.name")

    @field_validator("hidden")
    @classmethod
    def _positive(cls, hidden: tuple[int, ...]) -> tuple[int, ...]:
        if any(not 1 <= h <= 100_000 for h in hidden):
            raise ValueError(f"model.hidden sizes must lie in [1, 100000], got {list(hidden)}")
        return hidden

    @model_validator(mode="after")
    def _check(self) -> "ModelConfig":
        if self.hidden != (200, 200) and self.name != "mlp":
            raise ValueError("model.hidden sets the mlp's hidden layers; pass an imported factory's sizes in "
                             "model.options")
        if self.options and not is_import_path(self.name):
            raise ValueError("model.options are the keyword arguments of an imported factory "
                             "(name = 'package.module:factory')")
        _check_json(self.options, "model.options")
        return self


class LocalTrainingConfig(Strict):
    epochs: int = Field(1, ge=1, le=1000, description="E: local epochs")
    batch_size: int = Field(32, ge=0, description="B: minibatch size; 0 means full batch")
    lr: float = Field(0.2, gt=0, le=1000, description="eta_k: client learning rate (0.2 suits the default CNN)")
    optimizer: Literal["sgd", "nesterov"] = "sgd"
    momentum: float = Field(0.9, ge=0, lt=1, description="used by the nesterov optimiser")


class TopologyConfig(Strict):
    num_edges: int = Field(1, ge=1, le=1000)
    buffer_size: int = Field(1, ge=1, description="B: edge contributions per cloud update")
    edge_rounds: int = Field(1, ge=1, le=1000, description="κ: rounds an edge runs with its clients per global round")


class RoundPolicy(Strict):
    deadline_s: float = Field(120.0, ge=0.1, le=86_400, description="how long an edge waits for its clients")
    min_fraction: float = Field(
        0.8, gt=0, le=1, description="share of selected clients that must answer before the deadline"
    )
    max_retries: int = Field(3, ge=0, description="re-runs of a round whose quorum failed")


class RunConfig(Strict):
    # The largest JSON body POST /runs reads (413 beyond): a config is a few KiB; user code's options
    # and params have room, a data set does not.
    max_body_bytes: ClassVar[int] = 2**20
    name: str = Field("run", min_length=1, max_length=200)
    seed: int = Field(0, ge=0, lt=2**31)
    # The algorithm and its params are checked by shared.algorithms.registry (`parse_config`, `check`),
    # where runs are created and where the reference runner starts: they need the algorithm's class,
    # and importing it here would make this plain model import torch (and close an import cycle).
    algorithm: str = "fedavg"
    params: dict[str, Any] = Field(default_factory=dict)
    rounds: int = Field(10, ge=1, le=100_000, description="T: global rounds")
    fraction: float = Field(1.0, gt=0, le=1, description="lambda: client participation fraction")
    weighting: Literal["samples", "uniform"] = Field(
        "samples", description="p_k: option 1 |D_k|/sum |D_i| or option 2 1/m"
    )
    server_lr: float = Field(1.0, gt=0, le=1000, description="eta_s")
    model: ModelConfig = ModelConfig()
    data: DataConfig = DataConfig()
    local: LocalTrainingConfig = LocalTrainingConfig()
    topology: TopologyConfig = TopologyConfig()
    policy: RoundPolicy = RoundPolicy()

    @model_validator(mode="after")
    def _check(self) -> "RunConfig":
        _check_finite(self.params, "params")
        if self.model.name == "cnn" and self.data.dataset in ("synthetic", "mnist1d"):
            raise ValueError(f"the cnn needs images; {self.data.dataset} has 1-D features (use logreg or mlp)")
        if self.data.num_clients < self.topology.num_edges:
            raise ValueError("every edge needs at least one client")
        return self

    def clients_of_edge(self, edge_index: int) -> list[int]:
        """Client indices an edge serves: round-robin over edges, so edge l has k ≡ l (mod L)."""
        return list(range(edge_index, self.data.num_clients, self.topology.num_edges))


def _check_finite(value: Any, where: str) -> None:
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{where} must be a finite number, got {value}")
    if isinstance(value, dict):
        for key, item in value.items():
            _check_finite(item, f"{where}.{key}")
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            _check_finite(item, f"{where}[{i}]")
