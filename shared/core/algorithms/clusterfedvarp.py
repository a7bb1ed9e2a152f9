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

In a run over registered devices (RunConfig.selection) the devices are not 0 … N−1 and no server holds their data
to cluster: `clusters` is then a map whose keys name device ids ("101") or labels ("region=eu"), each to a cluster
id. A device takes the cluster of its id, else of the first label entry (in the map's order) it registered with,
else a cluster of its own (a slot after every other, which it is alone in: FedVARP's y_k for it). Its cluster is
fixed when it joins (the update whose contribution first declares it) and kept in the cloud state ("clusters"),
so N and the cluster sizes grow with the roster (shared/core/roster.py) and a new cluster's slot starts at 0.

Everything else (the per-client Δw_k on the wire, m = the clients that answered, one edge only,
Σ_j y_{c_j} recomputed in float64 every round) is as in FedVARP. The memory is the cloud state's
"memory" group, per parameter of shape (G, *param.shape) in float64, because a cluster mean of float32 deltas is not a
float32 number. With singleton clusters this is FedVARP exactly.
"""
from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Generic, TypeVar

import torch
from pydantic import BaseModel, ConfigDict, Field

from fl_services.shared.core import roster
from fl_services.shared.core.algorithms.base import Contribution
from fl_services.shared.core.algorithms.clustering import label_histogram_clusters
from fl_services.shared.core.algorithms.fedvarp import FedVARP
from fl_services.shared.core.config import RunConfig
from fl_services.shared.core.records import Record


class ClusterParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    clusters: list[int] | dict[str, int] | None = Field(
        None, description="explicit client→cluster map: length N, ids in [0, N); in a run over registered devices, "
        "a map of device ids ('101') or labels ('region=eu') to cluster ids in [0, 100000)")
    num_clusters: int = Field(4, ge=1, le=100_000, description="k of the default label-histogram k-means")


CLUSTERS = "clusters"  # the cloud state's group (a run over registered devices): OF, each roster device's cluster
OF = "of"
MAX_NAMED_CLUSTER = 100_000  # bounds the slots a map can open (one copy of the model each)
_LABEL_KEY = re.compile(r"^([A-Za-z0-9_./-]+)=(.*)$")


def check_cluster_map(clusters: list[int] | dict[str, int] | None, num_clients: int, selected: bool = False) -> None:
    """An explicit client → cluster map must cover every client with ids in [0, N); a run over registered devices
    names its devices' clusters by id or label instead."""
    if selected:
        if not isinstance(clusters, dict):
            raise ValueError('a run over registered devices names its clusters by device id or label: params.clusters '
                             '= {"101": 0, "region=eu": 1} (its devices are not 0 … N−1, and no server holds their '
                             "data to cluster)")
        for key, cluster in clusters.items():
            if not (key.isdigit() or _LABEL_KEY.match(key)):
                raise ValueError(f"params.clusters key {key!r} names neither a device id nor a label 'key=value'")
            if not 0 <= cluster < MAX_NAMED_CLUSTER:
                raise ValueError(f"params.clusters ids must lie in [0, {MAX_NAMED_CLUSTER})")
        return
    if isinstance(clusters, dict):
        raise ValueError("params.clusters names device ids or labels only in a run over registered devices "
                         "(selection); a simulated run's map is a list, one cluster id per client")
    if clusters is None:
        return
    if len(clusters) != num_clients:
        raise ValueError(f"params.clusters maps {len(clusters)} clients but data.num_clients is {num_clients}")
    # Ids below N suffice for any map and keep the memory (one slot per id up to the largest) small.
    if min(clusters) < 0 or max(clusters) >= num_clients:
        raise ValueError(f"params.clusters must hold cluster ids in [0, {num_clients})")


def cluster_map(config: RunConfig, params: ClusterParams) -> list[int]:
    """The cluster of each client 0..N−1: the explicit map, else k-means on label histograms."""
    if isinstance(params.clusters, list):
        return list(params.clusters)
    return label_histogram_clusters(config.data, config.seed, params.num_clusters)


def named_cluster(clusters: dict[str, int], device: int, labels: dict[str, str]) -> int | None:
    """The cluster the map names for a device: by its id, else by the first label entry it carries."""
    if str(device) in clusters:
        return clusters[str(device)]
    for key, cluster in clusters.items():
        match = _LABEL_KEY.match(key)
        if match and labels.get(match.group(1)) == match.group(2):
            return cluster
    return None


def device_clusters(clusters: dict[str, int], devices: list[int], kept: list[int],
                    labels: dict[int, dict[str, str]]) -> list[int]:
    """The cluster of each roster device: `kept` for those that joined before, the map's (or a new one of its own,
    after every other) for the rest, from the labels they were declared with."""
    groups = list(kept)
    alone = max([*clusters.values(), *groups], default=-1) + 1
    for k in devices[len(kept):]:
        named = named_cluster(clusters, k, labels.get(k, {}))
        groups.append(alone if named is None else named)
        alone += named is None
    return groups


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
        check_cluster_map(params.clusters, config.data.num_clients, config.selection is not None)

    def memory_groups(self, cloud_state: Record | None = None,
                      contributions: Sequence[Contribution] = ()) -> list[int]:
        """Cluster of each of the run's devices, in roster order: of clients 0..N−1 in a simulated run; in a run
        over registered devices, as kept in `cloud_state` and, for those `contributions` declare first, named by
        the map."""
        if self.config.selection is None:
            if self._groups is None:
                self._groups = cluster_map(self.config, self.params)
            return self._groups
        assert isinstance(self.params.clusters, dict)  # check_cluster_map
        stored = (cloud_state or {}).get(CLUSTERS, {}).get(OF)
        kept = [] if stored is None else [int(g) for g in stored.tolist()]
        return device_clusters(self.params.clusters, roster.devices(self.config, cloud_state or {}), kept,
                               roster.labels(contributions))

    def memory_state(self, groups: list[int]) -> Record:
        if self.config.selection is None:
            return {}
        return {CLUSTERS: {OF: torch.tensor(groups, dtype=torch.int64)}}


class ClusterFedVARP(ClusterMemory[ClusterParams], FedVARP[ClusterParams]):
    name = "clusterfedvarp"

    def memory_dtype(self, param: torch.Tensor) -> torch.dtype:
        return torch.float64
