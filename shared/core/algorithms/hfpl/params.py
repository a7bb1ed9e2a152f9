"""HFPL's run parameters (RunConfig.params)."""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from fl_services.shared.core.models import FEATURE_FAMILIES


class HFPLParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    feature_dim: int = Field(64, ge=1, le=4096, description="d: the feature space every client maps into")
    # The squared norm sums over d dimensions, so λ_p is small: at 1 the pull overshoots at lr 0.05.
    # Bounded (classifier_lr as local.lr is): past float32's range (3.4e38) torch cannot even take the figure,
    # and a cloud update with classifier_lr = 1e308 failed ("cannot be converted to type float") at every retry.
    proto_weight: float = Field(0.05, ge=0, le=1e6, description="λ_p: weight of ‖f_i(x) − C̄_y‖²")
    families: list[str] = Field(["mlp", "cnn", "cnn_deep"], min_length=1,
                                description="feature-extractor families, assigned to clients in turn")
    client_families: list[str] | dict[int, str] | None = Field(
        None, description="explicit family per client id: a list over 0 … N−1, or by device id in a run over "
        "registered devices")
    feature_cap: int = Field(100, ge=1, le=100_000, description="features a client sends (a seeded subsample)")
    classifier_epochs: int = Field(5, ge=1, le=1000)
    classifier_lr: float = Field(0.1, gt=0, le=1000)
    classifier_batch_size: int = Field(64, ge=1)
    # Levers measured on FedProto's MNIST protocol (bench/fedproto_protocol.py, docs/benchmarks/fedproto-protocol.md).
    proto_distance: Literal["sum", "mean"] = Field(
        "sum", description="‖f_i(x) − C̄_y‖² summed over the d features, or their mean (FedProto's MSE: the same "
        "pull at a d× larger λ_p)")
    # Measured best on FedProto's protocol: 0.5 with local batch 8 and lr 0.02 (the bench's defaults). It stays 0
    # here because it belongs to the run's lr: with 0.5 the protocol diverged at lr 0.1, and runs default to 0.2.
    momentum: float = Field(0.0, ge=0, lt=1, description="heavy-ball momentum of the client's SGD (FedProto: 0.5); "
                            "0 leaves the run's local optimiser")
    classifier: Literal["linear", "cosine", "mlp"] = Field(
        "linear", description="G: linear, cosine (s·cos(z, w_j) + b_j: features compared by direction), or mlp "
        "(W·relu(V z + c) + b: one hidden layer, classes need not be linearly separable in R^d)")
    classifier_scale: float = Field(10.0, gt=0, le=1000, description="s of the cosine G")
    classifier_width: int = Field(128, ge=1, le=4096, description="h: hidden units of the mlp G")
    inference: Literal["classifier", "nearest_prototype"] = Field(
        "classifier", description="what a client predicts with (its reported accuracy): G∘f_i, or the nearest C̄_j")
    own_classes: bool = Field(False, description="a client predicts only among the classes it holds "
                              "(FedProto's evaluation)")
    staleness: Literal["none", "fedbuff"] = Field(
        "none", description="weight of a buffered triple in C̄: 1, or 1/√(1 + τ) for a triple τ versions stale "
        "(FedBuff's rule)")

    @model_validator(mode="after")
    def _known(self) -> "HFPLParams":
        named = self.client_families
        used = set(self.families) | set((named.values() if isinstance(named, dict) else named) or [])
        unknown = sorted(used - FEATURE_FAMILIES.keys())
        if unknown:
            raise ValueError(f"unknown feature families {unknown}; known: {sorted(FEATURE_FAMILIES)}")
        return self
