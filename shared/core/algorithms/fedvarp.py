"""FedVARP (Jhunjhunwala et al., UAI 2022): variance reduction for partial client participation.

Client: Δw_k = w_k − w after E epochs of minibatch SGD, exactly as FedAvg (the class reuses its
local_update). Server, with a memory y_k per client k ∈ [N], all 0 at first:

    v = (1/m) Σ_{k∈S} (Δw_k − y_k) + (1/N) Σ_{j=1..N} y_j
    w ← w + η_s v
    y_k ← Δw_k for k ∈ S, unchanged otherwise.

The paper writes the client's update as (w − w_k)/η_k and steps w ← w − η_s η_k v; the specification's
Δw_k = w_k − w and w ← w + η_s v is the same rule with the sign and η_k folded into Δw_k and η_s.

Choices the specification leaves open:
- m is the number of clients whose Δw_k reached the cloud this round, not max(⌊λN⌋, 1): when a
  straggler misses the deadline, v is the same estimator over the clients that answered (and leaves the
  straggler's y as it was). The two agree whenever every selected client answers.
- The rule is unweighted (1/m, 1/N) as in the specification and the paper; `weighting` does not apply.
- Δw_k crosses the wire per client (the "deltas" group: per parameter, the Δw_k of the contribution's
  clients stacked in id order, the model's dtype, float32) rather than as a partial sum: the cloud must
  see each Δw_k to store it as y_k. Hence one edge only (multi_edge = False) and no edge rounds; the
  memory is global.
- The memory is the cloud state's "memory" group: per parameter, y of shape (N, *param.shape) in the
  model's dtype; storing Δw_k there is exact. Σ_j y_j is recomputed from it every round in float64
  instead of kept as a running sum, so no rounding drift accumulates and the state holds nothing but the y's.

N is the run's devices (shared/core/roster.py): data.num_clients for a simulated run; in a run over registered
devices, those its edge declared as members so far. A device that joins gets y_k = 0, the value every y_k starts
from, and counts in N from the update whose contribution first declares it: the memory is keyed by device, a slot
per device in order of joining, and grows by a zero slot (docs/decisions/memories-keyed-by-device.md).

The maths is written once, for a memory with one slot per *group* of clients and clients that each
cover part of the coordinates (`varp_update`: `varp_direction` and `updated_memory` with coverage
masks, for FedSCAVAR's sub-models); FedVARP is the case where every client is its own group and covers
everything (full masks), ClusterFedVARP shares a slot per cluster.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from fl_services.shared.core import roster
from fl_services.shared.core.algorithms import aggregate
from fl_services.shared.core.algorithms.base import MODEL, ClientResult, Contribution, EdgeAggregate, P
from fl_services.shared.core.algorithms.fedavg import FedAvg
from fl_services.shared.core.config import RunConfig
from fl_services.shared.core.records import Record, RecordSpec
from fl_services.shared.core.tensors import InvalidContent, Tensors

DELTAS = "deltas"  # per parameter, the Δw_k of a contribution's clients stacked in id order
MEMORY = "memory"  # per parameter, y: one slot per group of clients


def varp_direction(deltas: torch.Tensor, masks: torch.Tensor, memory: torch.Tensor, rows: torch.Tensor,
                   sizes: torch.Tensor, num_clients: int) -> torch.Tensor:
    """v = (1/m) Σ_i M_i ⊙ (Δ_i − y_{rows[i]}) + (1/N) Σ_g sizes[g] y_g, in float64.

    deltas, masks: (m, *shape), one Δw per participating client (at full size) and where it is defined
    (all True unless the client trained a sub-model); memory: (G, *shape), one y per group; rows: (m,)
    the group of each participating client; sizes: (G,) clients per group, so that
    Σ_g sizes[g] y_g = Σ_{j=1..N} y_{group(j)}.
    """
    deltas, memory, masks = deltas.to(torch.float64), memory.to(torch.float64), masks.to(torch.float64)
    weights = sizes.to(torch.float64).reshape(-1, *([1] * (memory.dim() - 1)))
    return (masks * (deltas - memory[rows])).mean(0) + (weights * memory).sum(0) / num_clients


def updated_memory(memory: torch.Tensor, deltas: torch.Tensor, masks: torch.Tensor,
                   rows: torch.Tensor) -> torch.Tensor:
    """y_g ← per coordinate, the mean of the Δ_i with rows[i] = g that cover it; elsewhere unchanged.

    Sums run in float64 and the result is cast to memory's dtype; a group with a single Δ gets it back
    exactly."""
    shape = memory.shape
    sums = torch.zeros(shape, dtype=torch.float64).index_add_(0, rows, (masks * deltas).to(torch.float64))
    counts = torch.zeros(shape, dtype=torch.float64).index_add_(0, rows, masks.to(torch.float64))
    hit = counts > 0
    return torch.where(hit, sums / torch.where(hit, counts, 1.0), memory.to(torch.float64)).to(memory.dtype)


def stacked(per_client: list[Tensors]) -> Tensors:
    """The "deltas" group: per parameter, the clients' tensors stacked in the given (id) order."""
    return {name: torch.stack([t[name] for t in per_client]).contiguous() for name in per_client[0]}


@dataclass(frozen=True)
class BufferedClients:
    """Who is behind a buffer's contributions, laid out against the memory groups."""

    ids: list[int]  # in id order
    source: dict[int, tuple[Contribution, int]]  # the contribution carrying each client's Δw, and its row there
    rows: torch.Tensor  # (m,) the memory group of each client
    sizes: torch.Tensor  # (G,) clients per group, over all N
    num_groups: int

    def deltas(self, name: str) -> torch.Tensor:
        """(m, *shape): Δw of parameter `name` for every buffered client, in id order."""
        return torch.stack([c.tensors[DELTAS][name][row] for c, row in (self.source[k] for k in self.ids)])


def buffered_clients(algorithm: str, contributions: list[Contribution], groups: list[int],
                     slots: dict[int, int]) -> BufferedClients:
    """`groups[i]` is the memory group of the device in roster slot i, `slots` each device's slot (roster.slots);
    the ids are checked before they index it."""
    num_groups = max(groups) + 1
    ids = sorted(k for c in contributions for k in c.clients)
    check_client_ids(algorithm, ids, None)
    strangers = sorted(k for k in ids if k not in slots)
    if strangers:
        raise InvalidContent(f"{algorithm}: clients {strangers} are not registered for the run")
    return BufferedClients(
        ids=ids,
        source={k: (c, row) for c in contributions for row, k in enumerate(sorted(c.clients))},
        rows=torch.tensor([groups[slots[k]] for k in ids], dtype=torch.int64),
        sizes=torch.bincount(torch.tensor(groups, dtype=torch.int64), minlength=num_groups),
        num_groups=num_groups,
    )


def stored_memory(cloud_state: Record, name: str, param: torch.Tensor, num_groups: int,
                  dtype: torch.dtype) -> torch.Tensor:
    """y for parameter `name` from the cloud state: zeros before the first update, shape-checked after. A memory
    with fewer slots was stored before devices joined (slots are appended): theirs start at 0, as every y did."""
    shape = (num_groups, *param.shape)
    y = cloud_state.get(MEMORY, {}).get(name)
    if y is None:
        return torch.zeros(shape, dtype=dtype)
    if tuple(y.shape[1:]) != shape[1:] or y.shape[0] > num_groups:
        raise ValueError(f"the memory of {name!r} has shape {list(y.shape)}, expected {list(shape)}")
    if y.shape[0] < num_groups:
        return torch.cat([y, torch.zeros((num_groups - y.shape[0], *param.shape), dtype=y.dtype)])
    return y


def varp_update(model: Tensors, cloud_state: Record, b: BufferedClients, num_clients: int,
                dtype: Callable[[torch.Tensor], torch.dtype],
                coverage: Callable[[str], torch.Tensor]) -> tuple[Tensors, Tensors]:
    """(v, the new memory), parameter by parameter: `varp_direction` and `updated_memory` over the stored y
    (in `dtype(param)`), with `coverage(name)` the (m, *shape) masks of the buffered clients in id order."""
    step: Tensors = {}
    memory: Tensors = {}
    for name, param in model.items():
        y = stored_memory(cloud_state, name, param, b.num_groups, dtype(param))
        deltas, masks = b.deltas(name), coverage(name)
        step[name] = varp_direction(deltas, masks, y, b.rows, b.sizes, num_clients)
        memory[name] = updated_memory(y, deltas, masks, b.rows).contiguous()
    return step, memory


def memory_bytes(groups: list[int], params: Tensors, dtype: Callable[[torch.Tensor], torch.dtype]) -> int:
    """Size of y: one copy of every parameter per memory slot (none before any device is registered)."""
    slots = max(groups, default=-1) + 1
    return slots * sum(t.numel() * torch.empty(0, dtype=dtype(t)).element_size() for t in params.values())


def check_client_ids(algorithm: str, clients: Sequence[int], n: int | None) -> None:
    """Per-client payloads need distinct ids, in [0, N) for a simulated run (n = N; None: a run over registered
    devices, whose ids the cloud checks against the edge's declared members); anything else is refused before
    buffering."""
    duplicates = sorted(k for k, c in Counter(clients).items() if c > 1)
    outside = sorted(k for k in clients if n is not None and not 0 <= k < n)
    if duplicates or outside or not clients:
        within = f" in [0, {n})" if n is not None else ""
        raise InvalidContent(f"{algorithm} needs distinct client ids{within}; got duplicates "
                             f"{duplicates}, out of range {outside}, {len(clients)} clients")


def simulated_size(config: RunConfig) -> int | None:
    """N where ids must lie in [0, N): a simulated run's; None for a run over registered devices."""
    return config.data.num_clients if config.selection is None else None


def deltas_spec(params: Tensors, clients: list[int]) -> RecordSpec:
    """The "deltas" group for `clients`: a row per client of every parameter, in the model's dtype."""
    return {DELTAS: {name: ((len(clients), *t.shape), t.dtype) for name, t in params.items()}}


class FedVARP(FedAvg[P]):
    name = "fedvarp"
    multi_edge = False  # y spans all N clients
    edge_rounds = False  # the cloud must see every Δw_k of the round it applies
    secure_aggregation = False  # its memory keeps each client's last step
    robust_aggregation = False  # its step is the variance-reduced direction over its memory, not a mean
    stale_refusal = ("FedVARP's server memory keeps each client's last update y_k and corrects each new one by it: "
                     "a stale update corrects against a y_k of another global version, so the memory's "
                     "variance reduction no longer holds, whatever weight the update gets")

    # ---- the memory layout; ClusterFedVARP overrides these -------------------------------------
    def memory_groups(self, cloud_state: Record | None = None,
                      contributions: Sequence[Contribution] = ()) -> list[int]:
        """The memory slot of each of the run's devices, in roster order (roster.devices of `cloud_state`, which
        holds the devices `contributions` declare): FedVARP keeps one per device."""
        return list(range(len(roster.devices(self.config, cloud_state or {}))))

    def memory_state(self, groups: list[int]) -> Record:
        """What the cloud state keeps of the layout besides y (ClusterFedVARP: each device's cluster)."""
        return {}

    def memory_dtype(self, param: torch.Tensor) -> torch.dtype:
        return param.dtype  # y_k is a copy of a Δw_k, which arrives in the model's dtype

    def server_memory_bytes(self, global_: Record) -> int:
        return memory_bytes(self.memory_groups(), global_[MODEL], self.memory_dtype)

    # ---- edge ----------------------------------------------------------------------------------
    def client_weight(self, num_samples: int) -> float:
        return 1.0  # the rule is unweighted (1/m, 1/N)

    def edge_aggregate(
        self, results: list[ClientResult], edge_state: Record, round: int, edge_id: int | None = None
    ) -> tuple[EdgeAggregate, Record]:
        if not results:
            raise ValueError("cannot aggregate an empty set of results")
        ordered = sorted(results, key=lambda r: r.client_id)
        deltas = stacked([r.tensors[MODEL] for r in ordered])
        return EdgeAggregate({DELTAS: deltas}, sum(self.client_weight(r.num_samples) for r in ordered)), edge_state

    # ---- cloud ---------------------------------------------------------------------------------
    def contribution_spec(self, global_: Record, clients: list[int]) -> RecordSpec:
        check_client_ids(self.name, clients, simulated_size(self.config))
        return deltas_spec(global_[MODEL], clients)

    def cloud_update(
        self, global_: Record, contributions: list[Contribution], cloud_state: Record, round: int
    ) -> tuple[Record, Record]:
        groups = self.memory_groups(cloud_state, contributions)
        b = buffered_clients(self.name, contributions, groups, roster.slots(self.config, cloud_state))
        w = global_[MODEL]

        def everywhere(name: str) -> torch.Tensor:  # every client trained the whole model
            return torch.ones((len(b.ids), *w[name].shape), dtype=torch.bool)

        step, memory = varp_update(w, cloud_state, b, len(groups), self.memory_dtype, everywhere)
        return {MODEL: aggregate.add_scaled(w, step, self.config.server_lr)}, {MEMORY: memory,
                                                                              **self.memory_state(groups)}
