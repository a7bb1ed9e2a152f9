"""HFPL's hooks: who runs which extractor, the cloud's prototype and classifier update, the edge's incremental
aggregate, the client's prototype-regularised training, and the checks on what crosses the wire."""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from fl_services.shared.core import records, roster
from fl_services.shared.core.algorithms import base
from fl_services.shared.core.algorithms import staleness as staleness_
from fl_services.shared.core.algorithms.hfpl.classifier import (
    load_classifier,
    new_classifier,
    state_of,
    train_classifier,
)
from fl_services.shared.core.algorithms.hfpl.evaluation import held_out_figures
from fl_services.shared.core.algorithms.hfpl.layout import (
    ACCURACY,
    CLIENTS,
    COUNTS,
    EDGES,
    EVAL_METRICS,
    EVALUATION,
    EXTRACTOR,
    FEATURES,
    HEAD,
    LABELS,
    MEANS,
    PROTO_ACCURACY,
    PROTOTYPES,
    SAMPLE,
    SERVED,
    SERVED_HEAD,
    TEST_LOSS,
    ClientMemory,
    EdgeMemory,
)
from fl_services.shared.core.algorithms.hfpl.params import HFPLParams
from fl_services.shared.core.algorithms.prototypes import (
    ClientPrototypes,
    EdgePrototypes,
    cloud_update_prototypes,
    edge_aggregate_prototypes,
    empty,
)
from fl_services.shared.core.config import RunConfig, StalenessConfig
from fl_services.shared.core.data import ArrayDataset, load_client
from fl_services.shared.core.dvfs import before_epoch
from fl_services.shared.core.models import IMAGE_FAMILIES, build_feature_extractor
from fl_services.shared.core.records import Record, RecordSpec, pack, unpack
from fl_services.shared.core.seeding import CLASSIFIER, MODEL_INIT, derive_seed, seeded_default_generator
from fl_services.shared.core.tensors import Dim, InvalidContent, Tensors
from fl_services.shared.core.training import Evaluation, batches, make_optimizer


class HFPL(base.Algorithm[HFPLParams]):
    name = "hfpl"
    synchronous: ClassVar[bool] = False
    # The cloud adds and subtracts each edge's prototypes over hundreds of rounds (prototypes.py): they travel
    # in float64, as they are kept (a few classes × d values; the features already travel as float32).
    exact_wire_groups: ClassVar[frozenset[str]] = frozenset({PROTOTYPES})
    federated_evaluation: ClassVar[bool] = False  # its figures are the prototypes' (`evaluate`), the cloud's to compute

    @classmethod
    def check_config(cls, config: RunConfig) -> None:
        super().check_config(config)
        params = HFPLParams.model_validate(config.params)
        if isinstance(params.client_families, dict) and config.selection is None:
            raise ValueError("client_families names device ids only in a run over registered devices (selection); "
                             "a simulated run's is a list, one family per client")
        if isinstance(params.client_families, list) and config.selection is not None:
            raise ValueError('a run over registered devices names client_families by device id ({"101": "mlp"}): '
                             "its devices are not 0 … N−1")
        if isinstance(params.client_families, list) and len(params.client_families) != config.data.num_clients:
            raise ValueError(f"client_families names {len(params.client_families)} families for "
                             f"{config.data.num_clients} clients")
        if params.momentum > 0 and config.local.optimizer != "sgd":
            raise ValueError(f"params.momentum is heavy-ball SGD's; local.optimizer {config.local.optimizer!r} "
                             "has its own momentum")
        if config.topology.staleness != StalenessConfig():
            raise ValueError("hfpl weighs its stale triples by params.staleness (in C̄, not a model step): "
                             "topology.staleness is for the model-averaging algorithms")
        named = params.client_families
        used = set((named.values() if isinstance(named, dict) else named) or params.families)
        if used & IMAGE_FAMILIES and config.data.dataset in ("synthetic", "mnist1d"):
            raise ValueError(f"families {sorted(used & IMAGE_FAMILIES)} need images; "
                             f"{config.data.dataset} has 1-D features")

    # ---- who runs what ---------------------------------------------------------------------------
    def family_of(self, client_id: int) -> str:
        """Family of client i: explicit (by device id in a run over registered devices), or the families in turn
        over i // L, so every edge mixes them."""
        named = self.params.client_families
        if isinstance(named, list):
            return named[client_id]
        if named is not None and client_id in named:
            return named[client_id]
        families = self.params.families
        return families[(client_id // self.config.topology.num_edges) % len(families)]

    def client_group(self, client_id: int) -> str:
        return self.family_of(client_id)

    def feature_extractor(self, client_id: int, input_shape: tuple[int, ...]) -> nn.Module:
        seed = derive_seed(self.config.seed, MODEL_INIT, client_id + 1)
        return build_feature_extractor(self.family_of(client_id), input_shape, self.params.feature_dim, seed)

    # ---- cloud ---------------------------------------------------------------------------------
    def init_global(self, model: nn.Module) -> Record:
        # The run's `model` only tells J (its last layer's width): clients bring their own extractors.
        # (On 1-D data the config still needs a model that fits it, e.g. "mlp", as for every algorithm.)
        num_classes = [m for m in model.modules() if isinstance(m, nn.Linear)][-1].out_features
        d = self.params.feature_dim
        with seeded_default_generator(derive_seed(self.config.seed, MODEL_INIT, CLASSIFIER)):
            g = new_classifier(self.params, d, num_classes)
        return {
            PROTOTYPES: {MEANS: torch.zeros(num_classes, d, dtype=torch.float64),
                         COUNTS: torch.zeros(num_classes, dtype=torch.float64)},
            HEAD: state_of(g),
        }

    def model_parameters(self, global_: Record) -> Tensors:
        """(C̄, G) under the names the REST API has always served."""
        return {**{name: global_[group][member] for name, (group, member) in SERVED.items()},
                **{SERVED_HEAD + member: t for member, t in global_[HEAD].items()}}

    def _from_served(self, model: Tensors) -> Record:
        """The (C̄, G) record of a served model (model_parameters' inverse)."""
        global_: Record = {PROTOTYPES: {}, HEAD: {}}
        for name, (group, member) in SERVED.items():
            global_[group][member] = model[name]
        global_[HEAD] = {name.removeprefix(SERVED_HEAD): t for name, t in model.items() if name.startswith(SERVED_HEAD)}
        return global_

    def contribution_spec(self, global_: Record, clients: list[int], edge_id: int | None = None) -> RecordSpec:
        """Edge l's triple: at most feature_cap features per client of edge l (of any edge if None)."""
        return self._triple_spec(global_, self.params.feature_cap * self._population(edge_id), torch.float64)

    def _triple_spec(self, global_: Record, max_features: int, counts: torch.dtype) -> RecordSpec:
        """A client's result or an edge's triple: prototypes with counts, and a sample of ≤ max_features."""
        num_classes, d = global_[PROTOTYPES][MEANS].shape
        n = Dim("n", max_features)
        return {PROTOTYPES: {MEANS: ((num_classes, d), torch.float64), COUNTS: ((num_classes,), counts)},
                SAMPLE: {FEATURES: ((n, d), torch.float32), LABELS: ((n,), torch.int64)}}

    def _check_triple(self, global_: Record, tensors: Record, spec: RecordSpec) -> None:
        records.check(tensors, spec)
        _check_labels(tensors[SAMPLE][LABELS], global_[PROTOTYPES][MEANS].shape[0])
        records.check_magnitude(tensors, members={PROTOTYPES: (MEANS,), SAMPLE: (FEATURES,)})

    def _population(self, edge_id: int | None, population: int | None = None) -> int:
        """The clients of edge `edge_id`: those it declared (`population`), else its simulated roster's."""
        if population is not None:
            return population
        if edge_id is None:
            return self.config.data.num_clients
        return len(self.config.clients_of_edge(edge_id))

    def check_contribution(self, global_: Record, clients: list[int], tensors: Record, weight: float,
                           edge_id: int | None = None, population: int | None = None) -> None:
        # Bounded by the edge's own clients: an edge must not weigh in C̄ or in G's data as more than it is.
        population = self._population(edge_id, population)
        spec = self._triple_spec(global_, self.params.feature_cap * population, torch.float64)
        self._check_triple(global_, tensors, self.wire_spec(spec))
        counts = tensors[PROTOTYPES][COUNTS]
        if bool((counts < 0).any()) or bool((counts != counts.round()).any()) or bool((counts > population).any()):
            raise InvalidContent(f"counts must be whole numbers in [0, {population}] (the edge's clients)")

    def cloud_update(
        self, global_: Record, contributions: list[base.Contribution], cloud_state: Record, round: int
    ) -> tuple[Record, Record]:
        edges = sorted(c.edge_id for c in contributions)
        if len(set(edges)) != len(edges):
            raise ValueError(f"the buffer holds two triples of one edge: {edges}")
        memory = unpack(cloud_state.get(EDGES, {}), EdgeMemory)
        previous: dict[int, EdgePrototypes] = dict(memory)
        buffer = {c.edge_id: EdgePrototypes(
            c.tensors[PROTOTYPES][MEANS], c.tensors[PROTOTYPES][COUNTS] * self.staleness_weight(round - c.base_version))
            for c in contributions}
        means, total, previous = cloud_update_prototypes(global_[PROTOTYPES][MEANS], previous, buffer)

        # Nothing aliases the caller's tensors: pack copies, and the figures are cloned before they change.
        # Per device, in roster slots (shared/core/roster.py): a device that joined since is NaN, as all were at first.
        slots = roster.slots(self.config, cloud_state)
        evaluation = {k: _grown(v, len(slots)) for k, v in cloud_state.get(EVALUATION, {}).items()}
        for c in contributions:  # X^{l,cloud} ← X^l for the edges in the buffer
            l = c.edge_id
            memory[l] = EdgeMemory(means=previous[l].means, counts=previous[l].counts,
                                   features=c.tensors[SAMPLE][FEATURES], labels=c.tensors[SAMPLE][LABELS])
            for client, metrics in c.metrics.items():
                for name in EVAL_METRICS:
                    if name in metrics:
                        evaluation.setdefault(name, _nan(len(slots)))[slots[client]] = metrics[name]
        x = torch.cat([memory[l].features for l in sorted(memory)])
        y = torch.cat([memory[l].labels for l in sorted(memory)])
        head = train_classifier(self.params, self.config.seed, global_[HEAD], x, y, round)
        state = {EDGES: pack(memory), EVALUATION: evaluation}
        return {PROTOTYPES: {MEANS: means, COUNTS: total}, HEAD: head}, state

    def staleness_weight(self, staleness: int) -> float:
        """How much a triple τ versions stale counts in C̄ (its N^l scaled; kept until the edge's next triple)."""
        return 1.0 if self.params.staleness == "none" else staleness_.fedbuff(staleness)

    def server_memory_bytes(self, global_: Record) -> int:
        """Per edge C^{l,prev} and N^{l,prev} (f64), X^{l,cloud} (at most feature_cap rows of d f32
        features and i64 labels per client) and its packing index (id and rows per field, i64); per client
        its latest evaluation figures (f64)."""
        num_classes, d = global_[PROTOTYPES][MEANS].shape
        edges, clients = self.config.topology.num_edges, self.config.data.num_clients
        index = 1 + len(dataclasses.fields(EdgeMemory))
        return (edges * (num_classes * d + num_classes + index) * 8
                + clients * self.params.feature_cap * (d * 4 + 8) + clients * len(EVAL_METRICS) * 8)

    def evaluate(self, global_: Record, cloud_state: Record) -> Evaluation | None:
        """The mean over clients of each one's latest held-out figures (own f_i with G)."""
        evaluation = cloud_state.get(EVALUATION, {})
        accuracy = evaluation.get(ACCURACY)
        if accuracy is None:
            return Evaluation(math.nan, math.nan, 0)
        seen = ~torch.isnan(accuracy)
        loss = evaluation.get(TEST_LOSS, _nan(len(seen)))[seen]
        return Evaluation(float(loss.mean()), float(accuracy[seen].mean()), int(seen.sum()))

    def server_metrics(self, global_: Record, cloud_state: Record) -> dict[str, float]:
        """The mean over clients of each one's latest nearest-prototype accuracy (its f_i against C̄),
        which the history would otherwise only have for the clients of each update."""
        accuracy = cloud_state.get(EVALUATION, {}).get(PROTO_ACCURACY)
        seen = accuracy[~torch.isnan(accuracy)] if accuracy is not None else torch.empty(0)
        return {PROTO_ACCURACY: float(seen.mean())} if len(seen) else {}

    # ---- edge ----------------------------------------------------------------------------------
    def result_spec(self, task: Record) -> RecordSpec:
        return self._triple_spec(task, self.params.feature_cap, torch.int64)

    def check_result(self, task: Record, tensors: Record) -> None:
        self._check_triple(task, tensors, self.result_spec(task))
        if bool((tensors[PROTOTYPES][COUNTS] < 0).any()):
            raise InvalidContent("class counts must not be negative")

    def client_weight(self, num_samples: int) -> float:
        return 1.0

    def classifier(self, head: Tensors, trainable: bool) -> nn.Module:
        """G of the configured kind with the given state dict (HEAD's tensors)."""
        return load_classifier(self.params, head, trainable)

    def client_optimizer(self, parameters: Iterable[nn.Parameter]) -> torch.optim.Optimizer:
        """The client's optimiser: the run's local one, or heavy-ball SGD with params.momentum."""
        if self.params.momentum > 0:
            return torch.optim.SGD(parameters, lr=self.config.local.lr, momentum=self.params.momentum)
        return make_optimizer(parameters, self.config.local)

    def edge_aggregate(
        self, results: list[base.ClientResult], edge_state: Record, round: int, edge_id: int | None = None
    ) -> tuple[base.EdgeAggregate, Record]:
        """EdgeAggregate (incremental): see prototypes.edge_aggregate_prototypes; X^l = ∪_i X_i^{l,edge}."""
        if not results:
            raise ValueError("no client results to aggregate")
        if PROTOTYPES in edge_state:
            current = EdgePrototypes(edge_state[PROTOTYPES][MEANS], edge_state[PROTOTYPES][COUNTS])
        else:
            current = empty(*results[0].tensors[PROTOTYPES][MEANS].shape)
        memory = unpack(edge_state.get(CLIENTS, {}), ClientMemory)
        previous: dict[int, ClientPrototypes] = dict(memory)
        updates = {r.client_id: ClientPrototypes(r.tensors[PROTOTYPES][MEANS], r.tensors[PROTOTYPES][COUNTS] > 0)
                   for r in results}
        new, previous = edge_aggregate_prototypes(current, previous, updates)

        sample = {r.client_id: r.tensors[SAMPLE] for r in results}  # X_i^{l,edge} ← X_i^l
        kept = {i: sample[i] if i in sample else {FEATURES: memory[i].features, LABELS: memory[i].labels}
                for i in previous}
        memory = {i: ClientMemory(means=c.means, present=c.present, features=kept[i][FEATURES], labels=kept[i][LABELS])
                  for i, c in previous.items()}
        ids = sorted(memory)
        triple = {
            PROTOTYPES: {MEANS: new.means, COUNTS: new.counts},
            SAMPLE: {FEATURES: torch.cat([memory[i].features for i in ids]),
                     LABELS: torch.cat([memory[i].labels for i in ids])},
        }
        state = {PROTOTYPES: {MEANS: new.means, COUNTS: new.counts}, CLIENTS: pack(memory)}
        return base.EdgeAggregate(triple, float(len(results))), state

    # ---- client --------------------------------------------------------------------------------
    def client_model(self, client_id: int, state: Record, input_shape: tuple[int, ...]) -> nn.Module:
        """f_i as the client keeps it: its family's extractor with the state's weights (or initial ones)."""
        f = self.feature_extractor(client_id, input_shape)
        if EXTRACTOR in state:
            f.load_state_dict(state[EXTRACTOR])
        return f

    def evaluate_client(self, client_id: int, state: Record, model: Tensors, data: ArrayDataset) -> dict[str, float]:
        """Client i's f_i with the global (C̄, G), as the REST API serves it, on `data`: accuracy,
        nearest-prototype accuracy, loss."""
        global_ = self._from_served(model)
        f = self.client_model(client_id, state, tuple(data.x.shape[1:]))
        g = self.classifier(global_[HEAD], trainable=False)
        f.eval()
        own = load_client(self.config.data, self.config.seed, client_id).train.y
        return held_out_figures(self.params, f, g, global_[PROTOTYPES][MEANS], global_[PROTOTYPES][COUNTS] > 0, own,
                                data)

    def local_update(self, job: base.LocalJob, task: Record, state: Record) -> base.ClientUpdate:
        """ClientUpdate(i, C̄, G): K epochs of minibatch SGD on f_i with G frozen, minimising

            ℓ(batch) = 1/|batch| · Σ_{(x,y) ∈ batch} [ −log softmax(G(f_i(x)))_y
                                                       + λ_p · 1[C̄_y exists] · ‖f_i(x) − C̄_y‖²₂ ]

        (C̄_y exists once some client anywhere has reported class y). Returns c_i (class means of
        f_i(x) over the client's training samples, after training), up to feature_cap features with
        their labels, and f_i as the client's state. Metrics: the held-out accuracy of G∘f_i, of
        nearest-C̄ classification, and G∘f_i's held-out loss, all with the (C̄, G) it received.
        """
        train, test = job.data.train, job.data.test
        # Built on the CPU (seeded), then placed where the job's data is (shared/core/device.py).
        f = self.client_model(job.client_id, state, tuple(train.x.shape[1:])).to(train.x.device)
        g = self.classifier(task[HEAD], trainable=False).to(train.x.device)
        centres = task[PROTOTYPES][MEANS].to(torch.float32)
        exists = task[PROTOTYPES][COUNTS] > 0
        lam = self.params.proto_weight

        f.train()
        opt = self.client_optimizer(f.parameters())
        steps, loss_sum = 0, 0.0
        for epoch in range(self.config.local.epochs):
            before_epoch(epoch)  # DVFS: the client picks its frequency (a no-op outside a client process)
            for idx in batches(len(train), self.config.local.batch_size, job.generator):
                x, y = train.x[idx], train.y[idx]
                opt.zero_grad(set_to_none=True)
                z = f(x)
                squared = (z - centres[y]) ** 2
                pull = (squared.sum(1) if self.params.proto_distance == "sum" else squared.mean(1)) * exists[y]
                loss = F.cross_entropy(g(z), y) + lam * pull.mean()
                loss.backward()
                opt.step()
                loss_sum, steps = loss_sum + loss.item(), steps + 1
        if not math.isfinite(loss_sum):
            raise FloatingPointError(f"client {job.client_id}: local loss diverged")

        num_classes = centres.shape[0]
        with torch.no_grad():
            f.eval()
            z = f(train.x).to(torch.float64)
            counts = torch.bincount(train.y, minlength=num_classes)
            sums = torch.zeros(num_classes, z.shape[1], dtype=torch.float64, device=z.device).index_add_(0, train.y, z)
            means = sums / counts.clamp(min=1)[:, None].to(torch.float64)
            keep = torch.randperm(len(train), generator=job.generator)[: self.params.feature_cap].sort().values
            metrics = held_out_figures(self.params, f, g, task[PROTOTYPES][MEANS], exists, train.y, test)
        return base.ClientUpdate(
            tensors={PROTOTYPES: {MEANS: means, COUNTS: counts},
                     SAMPLE: {FEATURES: z[keep].to(torch.float32).contiguous(), LABELS: train.y[keep].clone()}},
            num_samples=len(train),
            loss=loss_sum / max(steps, 1),
            state={EXTRACTOR: {k: v.detach().clone() for k, v in f.state_dict().items()}},
            metrics=metrics,
        )


def _check_labels(labels: torch.Tensor, num_classes: int) -> None:
    if len(labels) and (int(labels.min()) < 0 or int(labels.max()) >= num_classes):
        raise InvalidContent(f"labels must lie in [0, {num_classes})")


def _nan(n: int) -> torch.Tensor:
    return torch.full((n,), math.nan, dtype=torch.float64)


def _grown(figures: torch.Tensor, n: int) -> torch.Tensor:
    """A copy of per-device figures with NaN for the devices that joined since (slots are appended)."""
    return torch.cat([figures, _nan(n - len(figures))]) if len(figures) < n else figures.clone()
