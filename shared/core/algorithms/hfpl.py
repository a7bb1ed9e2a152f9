"""Hierarchical Federated Prototype Learning, the asynchronous baseline (seeds/003).

Clients keep their own feature extractors f_i: x → R^d, of different architectures (families); only
class prototypes, counts and a sample of features travel. Edges aggregate prototypes incrementally;
the cloud consumes a buffer of B edge triples (C^l, N^l, X^l), updates the global prototypes C̄ and
trains a global classifier G (linear by default) on the union of the latest features of every edge.

Records (group: tensors; J classes, d = feature_dim):
    global / task   prototypes: means (J, d) f64, counts (J,) f64 · classifier: G's state dict: weight (J, d),
                    bias (J,); the mlp G's output layer is weight (J, h), bias (J,), its hidden layer
                    hidden.weight (h, d), hidden.bias (h,)
    client result   prototypes: means (J, d) f64, counts (J,) i64 (its samples per class)
                    sample: features (n, d), labels (n,) i64
    edge triple     prototypes: means (J, d) f64, counts (J,) f64 (clients per class) · sample: as a result's
    client state    extractor: f_i's state dict
    edge state      prototypes: (C^l, N^l) · clients: a ClientMemory per client, packed by id
    cloud state     edges: an EdgeMemory per edge, packed by id · evaluation: each client's latest figures (N,)
The model the REST API serves keeps the names it always had: prototypes, prototype_counts,
classifier.weight, classifier.bias (and classifier.hidden.weight, classifier.hidden.bias for the mlp G).
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar, Literal

import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field, model_validator
from torch import nn

from fl_services.shared.core import records
from fl_services.shared.core.algorithms.base import (
    Algorithm,
    ClientResult,
    ClientUpdate,
    Contribution,
    EdgeAggregate,
    LocalJob,
)
from fl_services.shared.core.algorithms.prototypes import (
    ClientPrototypes,
    EdgePrototypes,
    cloud_update_prototypes,
    edge_aggregate_prototypes,
    empty,
)
from fl_services.shared.core.config import RunConfig
from fl_services.shared.core.data import ArrayDataset, load_client, load_federated
from fl_services.shared.core.device import current, on_cpu
from fl_services.shared.core.dvfs import before_epoch
from fl_services.shared.core.models import FEATURE_FAMILIES, IMAGE_FAMILIES, build_feature_extractor
from fl_services.shared.core.records import Record, RecordSpec, pack, unpack
from fl_services.shared.core.seeding import (
    CLASSIFIER,
    LOCAL_TRAINING,
    MODEL_INIT,
    derive_seed,
    seeded_default_generator,
    torch_generator,
)
from fl_services.shared.core.tensors import Dim, InvalidContent, Tensors
from fl_services.shared.core.training import Evaluation, batches, make_optimizer

# Groups
PROTOTYPES, HEAD, SAMPLE, EXTRACTOR = "prototypes", "classifier", "sample", "extractor"  # HEAD: G
CLIENTS, EDGES, EVALUATION = "clients", "edges", "evaluation"
# Tensors within them
MEANS, COUNTS, WEIGHT, BIAS, FEATURES, LABELS = "means", "counts", "weight", "bias", "features", "labels"
HIDDEN_WEIGHT = "hidden.weight"  # the mlp G's first layer (see MLPClassifier)
# The served model's names (GET /runs/{id}/model), as they were before the state had groups: C̄ under
# these, and G's state dict under "classifier." (classifier.weight, classifier.bias for the linear G).
SERVED = {"prototypes": (PROTOTYPES, MEANS), "prototype_counts": (PROTOTYPES, COUNTS)}
SERVED_HEAD = f"{HEAD}."
# What each client reports with its result; the cloud keeps every client's latest in "evaluation"
# (one value per client, NaN until it reports).
ACCURACY, PROTO_ACCURACY, TEST_LOSS = "accuracy", "proto_accuracy", "test_loss"
EVAL_METRICS = (ACCURACY, PROTO_ACCURACY, TEST_LOSS)


@dataclass(frozen=True)
class Sample:
    """Features with their labels: X_i of a client, X^l of an edge."""

    features: torch.Tensor  # (n, d) float32
    labels: torch.Tensor  # (n,) int64


@dataclass(frozen=True)
class ClientMemory(Sample, ClientPrototypes):
    """What an edge keeps of client i (packed by id): c_i^{prev} (means, classes it ever had) and X_i^{l,edge}."""


@dataclass(frozen=True)
class EdgeMemory(Sample, EdgePrototypes):
    """What the cloud keeps of edge l (packed by id): (C^{l,prev}, N^{l,prev}) and X^{l,cloud}."""


class HFPLParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    feature_dim: int = Field(64, ge=1, le=4096, description="d: the feature space every client maps into")
    # The squared norm sums over d dimensions, so λ_p is small: at 1 the pull overshoots at lr 0.05.
    # Bounded (classifier_lr as local.lr is): past float32's range (3.4e38) torch cannot even take the figure,
    # and a cloud update with classifier_lr = 1e308 failed ("cannot be converted to type float") at every retry.
    proto_weight: float = Field(0.05, ge=0, le=1e6, description="λ_p: weight of ‖f_i(x) − C̄_y‖²")
    families: list[str] = Field(["mlp", "cnn", "cnn_deep"], min_length=1,
                                description="feature-extractor families, assigned to clients in turn")
    client_families: list[str] | None = Field(None, description="explicit family per client id")
    feature_cap: int = Field(100, ge=1, le=100_000, description="features a client sends (a seeded subsample)")
    classifier_epochs: int = Field(5, ge=1, le=1000)
    classifier_lr: float = Field(0.1, gt=0, le=1000)
    classifier_batch_size: int = Field(64, ge=1)
    # Levers measured on FedProto's MNIST protocol (bench/fedproto_protocol.py, docs/fedproto-protocol.md).
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
        unknown = sorted(set(self.families + (self.client_families or [])) - FEATURE_FAMILIES.keys())
        if unknown:
            raise ValueError(f"unknown feature families {unknown}; known: {sorted(FEATURE_FAMILIES)}")
        return self


class HFPL(Algorithm[HFPLParams]):
    name = "hfpl"
    synchronous: ClassVar[bool] = False
    # The cloud adds and subtracts each edge's prototypes over hundreds of rounds (prototypes.py): they travel
    # in float64, as they are kept (a few classes × d values; the features already travel as float32).
    exact_wire_groups: ClassVar[frozenset[str]] = frozenset({PROTOTYPES})

    @classmethod
    def check_config(cls, config: RunConfig) -> None:
        super().check_config(config)
        params = HFPLParams.model_validate(config.params)
        if params.client_families is not None and len(params.client_families) != config.data.num_clients:
            raise ValueError(f"client_families names {len(params.client_families)} families for "
                             f"{config.data.num_clients} clients")
        if params.momentum > 0 and config.local.optimizer != "sgd":
            raise ValueError(f"params.momentum is heavy-ball SGD's; local.optimizer {config.local.optimizer!r} "
                             "has its own momentum")
        used = set(params.client_families or params.families)
        if used & IMAGE_FAMILIES and config.data.dataset in ("synthetic", "mnist1d"):
            raise ValueError(f"families {sorted(used & IMAGE_FAMILIES)} need images; "
                             f"{config.data.dataset} has 1-D features")

    # ---- who runs what ---------------------------------------------------------------------------
    def family_of(self, client_id: int) -> str:
        """Family of client i: explicit, or the families in turn over i // L, so every edge mixes them."""
        if self.params.client_families is not None:
            return self.params.client_families[client_id]
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
            g = self._new_classifier(d, num_classes)
        return {
            PROTOTYPES: {MEANS: torch.zeros(num_classes, d, dtype=torch.float64),
                         COUNTS: torch.zeros(num_classes, dtype=torch.float64)},
            HEAD: _state_of(g),
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

    def _population(self, edge_id: int | None) -> int:
        if edge_id is None:
            return self.config.data.num_clients
        return len(self.config.clients_of_edge(edge_id))

    def check_contribution(self, global_: Record, clients: list[int], tensors: Record, weight: float,
                           edge_id: int | None = None) -> None:
        # Bounded by the edge's own clients: an edge must not weigh in C̄ or in G's data as more than it is.
        self._check_triple(global_, tensors, self.wire_spec(self.contribution_spec(global_, clients, edge_id)))
        counts, population = tensors[PROTOTYPES][COUNTS], self._population(edge_id)
        if bool((counts < 0).any()) or bool((counts != counts.round()).any()) or bool((counts > population).any()):
            raise InvalidContent(f"counts must be whole numbers in [0, {population}] (the edge's clients)")

    def cloud_update(
        self, global_: Record, contributions: list[Contribution], cloud_state: Record, round: int
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
        evaluation = {k: v.clone() for k, v in cloud_state.get(EVALUATION, {}).items()}
        for c in contributions:  # X^{l,cloud} ← X^l for the edges in the buffer
            l = c.edge_id
            memory[l] = EdgeMemory(means=previous[l].means, counts=previous[l].counts,
                                   features=c.tensors[SAMPLE][FEATURES], labels=c.tensors[SAMPLE][LABELS])
            for client, metrics in c.metrics.items():
                for name in EVAL_METRICS:
                    if name in metrics:
                        evaluation.setdefault(name, _nan(self.config.data.num_clients))[client] = metrics[name]
        x = torch.cat([memory[l].features for l in sorted(memory)])
        y = torch.cat([memory[l].labels for l in sorted(memory)])
        head = self.train_classifier(global_[HEAD], x, y, round)
        state = {EDGES: pack(memory), EVALUATION: evaluation}
        return {PROTOTYPES: {MEANS: means, COUNTS: total}, HEAD: head}, state

    def staleness_weight(self, staleness: int) -> float:
        """How much a triple τ versions stale counts in C̄ (its N^l scaled; kept until the edge's next triple)."""
        return 1.0 if self.params.staleness == "none" else 1.0 / math.sqrt(1.0 + staleness)

    def server_memory_bytes(self, global_: Record) -> int:
        """Per edge C^{l,prev} and N^{l,prev} (f64), X^{l,cloud} (at most feature_cap rows of d f32
        features and i64 labels per client) and its packing index (id and rows per field, i64); per client
        its latest evaluation figures (f64)."""
        num_classes, d = global_[PROTOTYPES][MEANS].shape
        edges, clients = self.config.topology.num_edges, self.config.data.num_clients
        index = 1 + len(dataclasses.fields(EdgeMemory))
        return (edges * (num_classes * d + num_classes + index) * 8
                + clients * self.params.feature_cap * (d * 4 + 8) + clients * len(EVAL_METRICS) * 8)

    def train_classifier(self, head: Tensors, x: torch.Tensor, y: torch.Tensor, round: int) -> Tensors:
        """G ← a few epochs of minibatch SGD on cross-entropy over X, from the current G (its state dict), on the
        compute device (shared/core/device.py); the batch order is drawn on the CPU."""
        device = current()
        g = self.classifier(head, trainable=True).to(device)
        x, y = x.to(device), y.to(device)
        opt = torch.optim.SGD(g.parameters(), lr=self.params.classifier_lr)
        generator = torch_generator(self.config.seed, CLASSIFIER, round)
        for _ in range(self.params.classifier_epochs):
            for idx in batches(len(y), self.params.classifier_batch_size, generator):
                opt.zero_grad(set_to_none=True)
                F.cross_entropy(g(x[idx]), y[idx]).backward()
                opt.step()
        return on_cpu(_state_of(g))

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
        hidden = head.get(HIDDEN_WEIGHT, head[WEIGHT])  # the layer that reads z: (h or J, d)
        g = self._new_classifier(hidden.shape[1], head[WEIGHT].shape[0])
        g.load_state_dict(head)
        g.requires_grad_(trainable)
        return g

    def _new_classifier(self, d: int, num_classes: int) -> nn.Module:
        """A freshly initialised G of the configured kind (drawing from the default generator)."""
        if self.params.classifier == "cosine":
            return CosineClassifier(d, num_classes, self.params.classifier_scale)
        if self.params.classifier == "mlp":
            return MLPClassifier(d, num_classes, self.params.classifier_width)
        return nn.Linear(d, num_classes)

    def client_optimizer(self, parameters) -> torch.optim.Optimizer:
        """The client's optimiser: the run's local one, or heavy-ball SGD with params.momentum."""
        if self.params.momentum > 0:
            return torch.optim.SGD(parameters, lr=self.config.local.lr, momentum=self.params.momentum)
        return make_optimizer(parameters, self.config.local)

    @torch.no_grad()
    def _evaluate(self, f: nn.Module, g: nn.Module, prototypes: torch.Tensor, exists: torch.Tensor,
                  own: torch.Tensor, test) -> dict[str, float]:
        """Held-out figures of f_i on `test`: ACCURACY is the configured inference's, PROTO_ACCURACY the nearest
        C̄_j's (once some exists), TEST_LOSS G's cross-entropy over all classes. With own_classes, both
        predict among the classes in `own` (the client's training labels) only."""
        if len(test) == 0:
            return {}
        z = f(test.x)
        logits = g(z)
        allowed = torch.ones(logits.shape[1], dtype=torch.bool, device=logits.device)
        if self.params.own_classes:
            allowed = torch.zeros_like(allowed).index_fill_(0, own.unique(), True)
        predicted = {ACCURACY: logits.masked_fill(~allowed, -math.inf).argmax(1)}
        if bool(exists.any()):
            distance = torch.cdist(z.to(torch.float64), prototypes)
            distance[:, ~(exists & allowed)] = math.inf
            predicted[PROTO_ACCURACY] = distance.argmin(1)
        if self.params.inference == "nearest_prototype":
            # Until some C̄_j exists (a client's first round) there is nothing to be near: G answers.
            predicted[ACCURACY] = predicted.get(PROTO_ACCURACY, predicted[ACCURACY])
        metrics = {name: float((p == test.y).float().mean()) for name, p in predicted.items()}
        return {**metrics, TEST_LOSS: float(F.cross_entropy(logits, test.y))}

    def edge_aggregate(
        self, results: list[ClientResult], edge_state: Record, round: int
    ) -> tuple[EdgeAggregate, Record]:
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
        return EdgeAggregate(triple, float(len(results))), state

    # ---- client --------------------------------------------------------------------------------
    def client_model(self, client_id: int, state: Record, input_shape: tuple[int, ...]) -> nn.Module:
        """f_i as the client keeps it: its family's extractor with the state's weights (or initial ones)."""
        f = self.feature_extractor(client_id, input_shape)
        if EXTRACTOR in state:
            f.load_state_dict(state[EXTRACTOR])
        return f

    def train_alone(self, client_id: int, train: ArrayDataset, epochs: int,
                    after_epoch: Callable[[int, nn.Module], None] | None = None) -> nn.Module:
        """The local-only baseline of client i: its extractor (its family, its initial weights) with a private
        linear head, trained on `train` alone by plain cross-entropy with the client's optimiser; returned in
        eval mode. `after_epoch(e, model)` sees the model after e epochs (in eval mode), which is what a run of
        e epochs would return: the epochs' shuffles do not depend on the total."""
        f = self.feature_extractor(client_id, tuple(train.x.shape[1:]))
        num_classes = load_federated(self.config.data, self.config.seed).num_classes
        with seeded_default_generator(derive_seed(self.config.seed, MODEL_INIT, 10_000 + client_id)):
            head = nn.Linear(self.params.feature_dim, num_classes)
        model = nn.Sequential(f, head)
        opt = self.client_optimizer(model.parameters())
        model.train()
        for epoch in range(epochs):
            generator = torch_generator(self.config.seed, LOCAL_TRAINING, epoch, client_id)
            for idx in batches(len(train), self.config.local.batch_size, generator):
                opt.zero_grad(set_to_none=True)
                F.cross_entropy(model(train.x[idx]), train.y[idx]).backward()
                opt.step()
            if after_epoch is not None:
                after_epoch(epoch + 1, model.eval())
                model.train()
        return model.eval()

    def evaluate_client(self, client_id: int, state: Record, model: Tensors, data) -> dict[str, float]:
        """Client i's f_i with the global (C̄, G), as the REST API serves it, on `data`: accuracy,
        nearest-prototype accuracy, loss."""
        global_ = self._from_served(model)
        f = self.client_model(client_id, state, tuple(data.x.shape[1:]))
        g = self.classifier(global_[HEAD], trainable=False)
        f.eval()
        own = load_client(self.config.data, self.config.seed, client_id).train.y
        return self._evaluate(f, g, global_[PROTOTYPES][MEANS], global_[PROTOTYPES][COUNTS] > 0, own, data)

    def local_update(self, job: LocalJob, task: Record, state: Record) -> ClientUpdate:
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
            metrics = self._evaluate(f, g, task[PROTOTYPES][MEANS], exists, train.y, test)
        return ClientUpdate(
            tensors={PROTOTYPES: {MEANS: means, COUNTS: counts},
                     SAMPLE: {FEATURES: z[keep].to(torch.float32).contiguous(), LABELS: train.y[keep].clone()}},
            num_samples=len(train),
            loss=loss_sum / max(steps, 1),
            state={EXTRACTOR: {k: v.detach().clone() for k, v in f.state_dict().items()}},
            metrics=metrics,
        )


class CosineClassifier(nn.Linear):
    """G as s·cos(z, w_j) + b_j: the weight rows are class directions, the features' norms do not count."""

    def __init__(self, in_features: int, out_features: int, scale: float):
        super().__init__(in_features, out_features)
        self.scale = scale

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.scale * F.normalize(z, dim=1) @ F.normalize(self.weight, dim=1).T + self.bias


class MLPClassifier(nn.Module):
    """G as W·relu(V z + c) + b, one hidden layer of h units (issue 12's non-linear G). The output layer keeps
    the linear G's names (weight, bias), the hidden one is hidden.weight, hidden.bias."""

    def __init__(self, in_features: int, out_features: int, width: int):
        super().__init__()
        self.hidden = nn.Linear(in_features, width)
        out = nn.Linear(width, out_features)
        self.weight, self.bias = out.weight, out.bias

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return F.linear(F.relu(self.hidden(z)), self.weight, self.bias)


def _state_of(g: nn.Module) -> Tensors:
    """G's state dict, detached copies: what HEAD holds."""
    return {name: t.detach().clone() for name, t in g.state_dict().items()}


def _check_labels(labels: torch.Tensor, num_classes: int) -> None:
    if len(labels) and (int(labels.min()) < 0 or int(labels.max()) >= num_classes):
        raise InvalidContent(f"labels must lie in [0, {num_classes})")


def _nan(n: int) -> torch.Tensor:
    return torch.full((n,), math.nan, dtype=torch.float64)
