"""ClusterFedVARP (Jhunjhunwala et al., UAI 2022): FedVARP with one server-memory slot per cluster of
clients instead of one per client, so the memory is O(G·d) rather than O(N·d).

With clusters g ∈ [G], client k in cluster c_k, memory y_g = 0 at first:

    v = (1/m) Σ_{k∈S} (Δw_k − y_{c_k}) + (1/N) Σ_{j=1..N} y_{c_j}     (each cluster counted with its size)
    w ← w + η_s v
    y_g ← mean of Δw_i over i ∈ S ∩ C_g, unchanged if no client of g took part.

The client→cluster map is a run setting (params):
- `clusters`: an explicit map, one cluster id in [0, N) per client (length N). Ids need not be
  contiguous: G = the largest id + 1, and an id nobody has is a slot that stays 0 and never counts.
- otherwise the default: k-means (k = `num_clusters`, default 4, capped at N) on the clients' label
  histograms, i.e. each client's share of every class in its training split, computed once per
  algorithm instance from load_federated(config.data, config.seed) with Lloyd's algorithm from a
  k-means++ start seeded by the run seed (fl_services.shared.core.algorithms.clustering). Clusters are numbered by
  their first client, so client 0 is in cluster 0; there are fewer than k when clients' histograms
  coincide exactly (e.g. clients that each hold one and the same class); G is what k-means found.

Everything else (the per-client Δw_k on the wire, m = the clients that answered, one edge only,
Σ_j y_{c_j} recomputed in float64 every round) is as in FedVARP. The memory is the cloud state's
"memory" group, per parameter of shape (G, *param.shape) in float64, because a cluster mean of float32 deltas is not a
float32 number. With singleton clusters this is FedVARP exactly.
"""
from __future__ import annotations

from typing import Generic, TypeVar

import torch
from pydantic import BaseModel, ConfigDict, Field

from fl_services.shared.core.algorithms.clustering import label_histogram_clusters
from fl_services.shared.core.algorithms.fedvarp import FedVARP
from fl_services.shared.core.config import RunConfig
from fl_services.shared.core.numbers import Int


class ClusterParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    clusters: list[Int] | None = Field(None, description="explicit client→cluster map: length N, ids in [0, N)")
    num_clusters: Int = Field(4, ge=1, le=100_000, description="k of the default label-histogram k-means")


def check_cluster_map(clusters: list[int] | None, num_clients: int) -> None:
    """An explicit client → cluster map must cover every client with ids in [0, N)."""
    if clusters is None:
        return
    if len(clusters) != num_clients:
        raise ValueError(f"params.clusters maps {len(clusters)} clients but data.num_clients is {num_clients}")
    # Ids below N suffice for any map and keep the memory (one slot per id up to the largest) small.
    if min(clusters) < 0 or max(clusters) >= num_clients:
        raise ValueError(f"params.clusters must hold cluster ids in [0, {num_clients})")


def cluster_map(config: RunConfig, params: ClusterParams) -> list[int]:
    """The cluster of each client 0..N−1: the explicit map, else k-means on label histograms."""
    if params.clusters is not None:
        return list(params.clusters)
    return label_histogram_clusters(config.data, config.seed, params.num_clusters)


CP = TypeVar("CP", bound=ClusterParams)


class ClusterMemory(Generic[CP]):
    """Mixin: server memory per cluster of clients (ClusterFedVARP, FedSCAVAR); the map is checked with
    the config and computed once per algorithm instance."""

    config: RunConfig
    params: CP
    Params: type[BaseModel]

    def __init__(self, config: RunConfig):
        super().__init__(config)  # type: ignore[call-arg]
        self._groups: list[int] | None = None

    @classmethod
    def check_config(cls, config: RunConfig) -> None:
        super().check_config(config)  # type: ignore[misc]
        params = cls.Params.model_validate(config.params)
        assert isinstance(params, ClusterParams)
        check_cluster_map(params.clusters, config.data.num_clients)

    def memory_groups(self) -> list[int]:
        """Cluster of each client 0..N−1."""
        if self._groups is None:
            self._groups = cluster_map(self.config, self.params)
        return self._groups


class ClusterFedVARP(ClusterMemory[ClusterParams], FedVARP[ClusterParams]):
    name = "clusterfedvarp"

    def memory_dtype(self, param: torch.Tensor) -> torch.dtype:
        return torch.float64
