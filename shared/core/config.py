"""The run configuration: everything that determines a training run's result.

A `RunConfig` is what an administrator POSTs to the cloud and what the in-process reference
runner takes; the same config and seed give the same global model either way.
"""
from __future__ import annotations

import json
import math
import re
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue, field_validator, model_validator

from fl_services.shared.core.dvfs import DEFAULT_PROFILE, PROFILES, DeviceProfile, Policy, check_frequencies
from fl_services.shared.core.numbers import Float, Int


class Strict(BaseModel):
    # A typo in a config key must be an error, not a silently ignored option. JSON's 1e400 parses to inf,
    # which would be stored as null and make the run unreadable: every float must be finite.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class ConfigError(ValueError):
    """A config refused because of one field, named by its dotted path (e.g. "topology.buffer_size"): a 422 gives
    that place (shared.core.algorithms.registry.parse_config), not the config's root."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.loc = tuple(field.split("."))


MAX_SYNTHETIC_DEVICES = 1000


BUILTIN_DATASETS = ("mnist5k", "digits", "npz", "synthetic", "mnist1d")
BUILTIN_MODELS = ("logreg", "mlp", "cnn", "flower_cnn")
# "package.module:attribute": user code the services import (see shared.core.user_code).
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
    path: str | None = Field(None, description='only for dataset="npz": a file with x_train, y_train, x_test, '
                             "y_test and, for partition='file', client_train (the client index of every training row)")
    options: dict[str, JsonValue] = Field(
        default_factory=dict, description="keyword arguments of an imported loader (JSON values)")
    partition: Literal["iid", "dirichlet", "shards", "file", "natural"] = Field(
        "iid", description="iid | dirichlet | shards | file: the client index stored with the data (an npz's or "
        "an imported loader's client_train) | natural: the synthetic generator's own devices")
    alpha: Float = Field(0.5, gt=0, description="Dirichlet concentration (partition='dirichlet')")
    shards_per_client: Int = Field(2, ge=1, description="McMahan's shards each client gets (partition='shards')")
    num_clients: Int = Field(10, ge=1, le=100_000, description=(
        "N of a simulated federation (a run without a selection): clients 0 … N − 1, client k at edge k mod L"))
    synthetic_alpha: Float = Field(1.0, ge=0, le=100, description="α of FedProx's Synthetic(α, β): how much local "
                                   "models differ")
    synthetic_beta: Float = Field(1.0, ge=0, le=100, description="β of FedProx's Synthetic(α, β): how much local "
                                  "data differ")
    test_fraction: Float = Field(0.2, gt=0, lt=1, description="held-out share of the pooled data")
    client_holdout: Float = Field(
        0.2, ge=0, lt=1, description="share of each client's rows held out as its own test split (personalised "
        "evaluation), whatever the partition; training and the weights p_k use the rest; 0: every row trains")

    @field_validator("dataset")
    @classmethod
    def _dataset_name(cls, name: str) -> str:
        return _builtin_or_import_path(name, BUILTIN_DATASETS, "data.dataset")

    @model_validator(mode="after")
    def _check(self) -> "DataConfig":
        if self.dataset == "npz" and not self.path:
            raise ConfigError("path", "dataset 'npz' needs a path")
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
    name: str = Field("cnn", description="logreg | mlp | cnn | flower_cnn (Flower's quickstart CNN), or "
                      "'package.module:factory', a function called as "
                      "factory(input_shape, num_classes, **options) that returns a torch nn.Module")
    hidden: tuple[Int, ...] = Field(
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
    epochs: Int = Field(1, ge=1, le=1000, description="E: local epochs")
    batch_size: Int = Field(32, ge=0, description="B: minibatch size; 0 means full batch")
    lr: Float = Field(0.2, gt=0, le=1000, description="eta_k: client learning rate (0.2 suits the default CNN)")
    optimizer: Literal["sgd", "nesterov"] = Field(
        "sgd", description="sgd | nesterov (torch SGD(nesterov=True) semantics, its buffer reset every round)")
    momentum: Float = Field(0.9, ge=0, lt=1, description="used by the nesterov optimiser")


class StalenessConfig(Strict):
    """How much a contribution computed on global version v counts in the update of version t (τ = t − v ≥ 0)
    when the cloud's buffer is smaller than the edges (topology.buffer_size < num_edges): its step is scaled
    by s(τ), and one staler than `max` is dropped. Every contribution of a synchronous run has τ = 0, s = 1."""

    function: Literal["fedbuff", "constant", "polynomial"] = Field(
        "fedbuff", description="s(τ): fedbuff 1/√(1 + τ) (FedBuff, Nguyen et al. 2022), constant 1, or polynomial "
        "(1 + τ)^−exponent")
    exponent: Float | None = Field(None, gt=0, le=10, description="a in polynomial's (1 + τ)^−a (left out: 0.5); "
                                   "only with function 'polynomial'")
    max: Int | None = Field(None, ge=0, le=100_000, description="a contribution more than this many versions "
                            "stale is dropped and counted in its update's record (left out: none is dropped)")

    @model_validator(mode="after")
    def _check(self) -> "StalenessConfig":
        if self.exponent is not None and self.function != "polynomial":
            raise ValueError(f"staleness.exponent is the polynomial's; function {self.function!r} takes none")
        return self


class TopologyConfig(Strict):
    num_edges: Int = Field(1, ge=1, le=1000, description="L: edges 0 … L − 1 take part; 1 with buffer_size 1 is "
                           "a flat topology")
    buffer_size: Int = Field(1, ge=1, description="B: edge contributions per cloud update (left out: num_edges for "
                             "a synchronous algorithm, 1 for an asynchronous one); B < num_edges with a model-"
                             "averaging algorithm (fedavg, fedprox, fedsgd) is buffered asynchronous averaging, "
                             "each contribution weighted by its staleness")
    edge_rounds: Int = Field(1, ge=1, le=1000, description="κ: rounds an edge runs with its clients per global round")
    staleness: StalenessConfig = Field(StalenessConfig(), description="how the cloud weighs a contribution "
                                       "computed on an older global version (buffer_size < num_edges)")


class RoundPolicy(Strict):
    deadline_s: Float = Field(120.0, ge=0.1, le=86_400, description="how long an edge waits for its clients")
    min_fraction: Float = Field(
        0.8, gt=0, le=1, description="share of selected clients that must answer before the deadline"
    )
    max_retries: Int = Field(3, ge=0, description="re-runs of a round whose quorum failed")
    answers: Int | None = Field(None, ge=1, le=100_000, description=(
        "K: an edge round closes as soon as K of its selected devices answered (buffered averaging at the "
        "edge), the later answers dropped or joined to its next round (policy.late); more than an edge selects "
        "means all of them. Unset: it waits for "
        "every one (or the deadline, with min_fraction). The reference runner takes the K devices of least "
        "modelled time (dvfs), which the services match where the devices are emulated (dvfs.time_scale)"))
    late: Literal["drop", "join"] = Field("drop", description=(
        "what becomes of an answer that comes after its edge round closed (policy.answers = K): 'drop' refuses it; "
        "'join' keeps it for the edge's next contribution, where it counts as a step computed on its own "
        "version (the cloud weighs it by its staleness), and its device gets no new task until then"))

    def enough(self, selected: int) -> int | None:
        """The answers that close a round of `selected` tasks (policy.answers, at most all of them); None: every
        one is waited for."""
        return None if self.answers is None else min(self.answers, selected)

    def quorum(self, selected: int) -> int:
        """The answers a round of `selected` tasks waits for, deadline after deadline (max_retries more), before
        it goes on with fewer: `enough`, else min_fraction of them (at least one)."""
        return self.enough(selected) or max(1, math.ceil(self.min_fraction * selected))


# 10 kbit/s: slower links gave a modelled transfer time beyond what a result's device report may carry
# (1e9 s at 1e-300 Mbit/s), and the clients failed every task of the run.
MIN_LINK_MBPS = 0.01


class DeviceOverride(Strict):
    """One client's device: a named profile and/or any of its figures replaced."""

    profile: str | None = Field(None, description="a named device profile (shared/core/dvfs.py)")
    frequencies_ghz: tuple[Float, ...] | None = Field(None, min_length=1, max_length=64,
                                                      description="the CPU frequencies the device may run at, GHz")
    cycles_per_sample: Float | None = Field(None, gt=0, le=1e12, description="c: CPU cycles one training "
                                            "sample costs")
    capacitance: Float | None = Field(None, gt=0, le=1e-20, description="α: effective switched capacitance; "
                                      "an epoch's dynamic energy is (α/2)·c·|D|·f²")
    static_power_w: Float | None = Field(None, ge=0, le=1000, description="the core's static power, W")
    link_mbps: Float | None = Field(None, ge=MIN_LINK_MBPS, le=1e6, description="the device's link rate, Mbit/s")

    @field_validator("profile")
    @classmethod
    def _profile(cls, name: str | None) -> str | None:
        return None if name is None else _known_profile(name)

    @field_validator("frequencies_ghz")
    @classmethod
    def _frequencies(cls, freqs: tuple[float, ...] | None) -> tuple[float, ...] | None:
        return None if freqs is None else check_frequencies(freqs)


def _known_profile(name: str) -> str:
    if name not in PROFILES:
        raise ValueError(f"unknown device profile {name!r}; known: {', '.join(PROFILES)}")
    return name


class DvfsConfig(Strict):
    """Each client's device model and how it picks its CPU frequency before each local epoch (shared/core/dvfs.py)."""

    policy: Policy = Field(
        "max", description="max: no DVFS, full speed | deadline: per epoch, the slowest frequency that still "
        "finishes before the edge round's deadline | slack: deadline plus the time the edge's contribution "
        "would wait in the cloud's buffer")
    profile: str = Field(DEFAULT_PROFILE, description=f"every client's device profile: {' | '.join(PROFILES)}")
    profiles: tuple[str, ...] = Field(
        (), max_length=100_000, description="device profiles cycled over client ids (client k gets the "
        "one at position k mod n); replaces `profile`")
    clients: dict[int, DeviceOverride] = Field(
        default_factory=dict, max_length=100_000, description="per-client overrides by client id: profile, "
        "frequencies_ghz, cycles_per_sample, capacitance, static_power_w, link_mbps")
    link_mbps: Float = Field(20.0, ge=MIN_LINK_MBPS, le=1e6,
                             description="link rate of the modelled communication time, Mbit/s")
    time_scale: Float = Field(
        0.0, ge=0, le=1000, description="emulated devices (no writable cpufreq): a client's wall time is "
        "stretched to its modelled time × this; 0: not stretched")
    deadline_s: Float | None = Field(
        None, gt=0, le=1e7, description="deadline and slack: modelled seconds an edge round's clients may take; "
        "unset: the slowest selected client's time at full speed, as last reported")

    @field_validator("profile")
    @classmethod
    def _profile(cls, name: str) -> str:
        return _known_profile(name)

    @field_validator("profiles")
    @classmethod
    def _profiles(cls, names: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(_known_profile(n) for n in names)

    @property
    def modelled(self) -> bool:
        """Whether the run models its clients' devices: a policy that picks frequencies, or devices, a link or a
        time scale of its own. The default section models none (every client a default device at full speed),
        so its time and energy figures would describe no one: the history leaves them out."""
        return self != DvfsConfig()

    def device(self, client_id: int) -> tuple[str, DeviceProfile, float]:
        """Client `client_id`'s profile name, device model and link rate (Mbit/s)."""
        name = self.profiles[client_id % len(self.profiles)] if self.profiles else self.profile
        override = self.clients.get(client_id)
        if override is None:
            return name, PROFILES[name], self.link_mbps
        name = override.profile or name
        figures = override.model_dump(exclude={"profile", "link_mbps"}, exclude_none=True)
        profile = PROFILES[name].model_copy(update=figures)  # each figure validated by DeviceOverride
        return (f"{name}*" if figures else name), profile, override.link_mbps or self.link_mbps


Aggregator = Literal["mean", "median", "trimmed_mean", "krum"]


class AggregationConfig(Strict):
    """How model steps are combined, at each level (shared/core/algorithms/robust.py). `mean` is the algorithm's own
    weighted mean; the others are Byzantine-robust and count every update once, whatever samples it claims."""

    edge: Aggregator = Field("mean", description="over an edge's client updates: mean | median (coordinate-wise) "
                             "| trimmed_mean | krum")
    cloud: Aggregator = Field("mean", description="over the edges' contributions (each edge's mean step): mean | "
                              "median | trimmed_mean | krum")
    trim_fraction: Float = Field(0.1, ge=0, lt=0.5, description="β of trimmed_mean: the share of values dropped "
                                 "at each end of every coordinate")
    krum_byzantine: Int = Field(1, ge=0, le=10_000, description="f of krum: the attackers tolerated; "
                                "krum needs at least 2f + 3 updates")
    krum_selected: Int = Field(1, ge=1, le=100_000, description="m of multi-Krum: the best-scored updates "
                               "averaged (1: Krum)")


# Below this, ε is beyond any meaning (some 1e14 at 1e-6), and near 1e-154 the accountant breaks: σ² underflows
# and opacus divides by zero (every cloud update of the run failed) or, with a sampling rate below 1, never
# returns (a cloud update, or the run's creation, held a thread for good).
MIN_NOISE_MULTIPLIER = 1e-6


class PrivacyConfig(Strict):
    """Client-level differential privacy, DP-FedAvg (McMahan et al., ICLR 2018; shared/core/algorithms/privacy.py)."""

    noise: Literal["off", "edge", "client"] = Field(
        "off", description="off | edge: each edge clips its clients' updates to clip_norm and adds Gaussian "
        "noise to their sum | client: each client clips and noises its own update (local DP)")
    clip_norm: Float = Field(1.0, gt=0, le=1e6, description="S: the L2 bound of one client's update")
    noise_multiplier: Float = Field(1.0, ge=MIN_NOISE_MULTIPLIER, le=1e4,
                                    description="σ: the noise's standard deviation is σ·S")
    delta: Float = Field(1e-5, gt=0, lt=1, description="δ at which ε is reported")
    dp_sgd_noise_multiplier: Float | None = Field(
        None, ge=MIN_NOISE_MULTIPLIER, le=1e4, description="DP-SGD inside each client's local training (opacus): σ "
        "of the Gaussian noise added to each minibatch's sum of per-example gradients clipped to dp_sgd_clip_norm "
        "(None: off)")
    dp_sgd_clip_norm: Float = Field(1.0, gt=0, le=1e6, description="C of DP-SGD: the L2 bound of one example's "
                                    "gradient")
    epsilon_budget: Float | None = Field(None, gt=0, description="ε at which the run stops: it ends after the last "
                                         "round whose ε is within the budget (None: runs every round)")

    @model_validator(mode="after")
    def _check(self) -> "PrivacyConfig":
        if self.epsilon_budget is not None and self.noise == "off":
            raise ValueError("privacy.epsilon_budget needs noise: set privacy.noise to 'edge' or 'client'")
        return self


class SecureAggregationConfig(Strict):
    """Secure aggregation (SecAgg, Bonawitz et al., CCS 2017; shared/core/secagg/): an edge learns only the sum of its
    devices' updates. Each device clips every coordinate of its step to ±clip, encodes it in fixed point with
    scale_bits fractional bits and sends its weight times that, masked, modulo 2^bits: the mean then errs by at
    most 2^-(scale_bits+1) per coordinate (docs/explanation-security.md)."""

    edge: bool = Field(False, description="mask each device's update so that its edge unmasks only their sum "
                       "(fedavg, fedprox and fedsgd; DP-FedAvg with privacy.noise = 'client')")
    cloud: bool = Field(False, description="mask each site's sum pairwise with the other sites' (keys agreed through "
                        "the cloud) so that the cloud unmasks only their total; needs every site in every update "
                        "(topology.buffer_size = num_edges) and aggregation.cloud = 'mean'")
    threshold: Float = Field(0.6, gt=0.5, le=1.0, description="t as a share of the devices that advertised keys: "
                             "the shares needed to rebuild a secret, and the fewest devices that must stay to the "
                             "end of the protocol (below it the round fails and is re-run)")
    bits: Int = Field(64, ge=16, le=64, description="k: updates are summed modulo 2^k")
    scale_bits: Int = Field(20, ge=0, le=52, description="f: fractional bits of the fixed-point encoding "
                            "(a coordinate is round(value·2^f))")
    clip: Float = Field(1000.0, gt=0, le=1e6, description="each coordinate of a device's step is clipped to ±clip "
                        "before it is encoded; weight·clip·2^f summed over an edge's devices must stay below "
                        "2^(k-1), or the round fails saying so")
    phase_timeout_s: Float = Field(60.0, gt=0, le=86_400, description="how long the edge waits for each step of "
                                   "the protocol after training (devices not heard from by then have dropped)")
    # With `cloud`: each site's X25519 public key (base64) by edge id, as the sites registered them, resolved by the
    # cloud when the run is created (cloud/services/sites.py) and relayed to every edge with the run's config.
    site_keys: dict[Annotated[int, Field(ge=0, le=2**31 - 1)], Annotated[str, Field(min_length=44, max_length=44)]] \
        | None = Field(None, max_length=10_000)

    @model_validator(mode="after")
    def _check(self) -> "SecureAggregationConfig":
        if self.clip * 2.0**self.scale_bits >= 2.0 ** (self.bits - 1):
            raise ValueError(f"secure_aggregation: clip·2^scale_bits = {self.clip * 2.0**self.scale_bits:g} leaves "
                             f"no room modulo 2^{self.bits}: lower clip or scale_bits, or raise bits")
        return self


LabelSelector = Annotated[dict[Annotated[str, Field(min_length=1, max_length=63)],
                                Annotated[str, Field(max_length=63)]], Field(min_length=1, max_length=32)]
SiteName = Annotated[str, Field(min_length=1, max_length=63)]
def matches(labels: dict[str, str], selector: dict[str, str] | None) -> bool:
    """Whether `labels` carry every key=value of `selector` (None: everything matches)."""
    return selector is None or all(labels.get(key) == value for key, value in selector.items())


class Selection(Strict):
    """Which of the federation that exists trains a run: the sites (edges) registered with the cloud, and the devices
    registered at them. Without it, a run is the simulated federation of data.num_clients clients over
    topology.num_edges edges."""

    sites: Literal["all"] | list[SiteName] | LabelSelector = Field(
        "all", description="all, a list of site names, or a label selector such as {\"region\": \"eu\"}")
    devices: Literal["all"] | LabelSelector = Field("all", description="all, or a label selector of devices")
    min_devices: Int = Field(1, ge=1, le=10**7, description="devices registered at the selected sites for the run "
                             "to leave `waiting`")
    start_timeout_s: Float = Field(600.0, gt=0, le=7 * 86400, description="how long the run may wait for them "
                                   "before it stops; and, once admitted, how long it may stay at version 0 without "
                                   "a member able to train at enough of its sites (each refused device's reason "
                                   "given)")
    # The selected sites' edge ids, resolved by the cloud from its site registry when the run is created.
    edge_ids: list[Annotated[Int, Field(ge=0, le=2**31 - 1)]] | None = Field(None, max_length=10_000)

    @property
    def device_selector(self) -> dict[str, str] | None:
        return None if self.devices == "all" else self.devices

    def takes_site(self, name: str, labels: dict[str, str]) -> bool:
        if self.sites == "all":
            return True
        return name in self.sites if isinstance(self.sites, list) else matches(labels, self.sites)


class RunConfig(Strict):
    # The largest JSON body POST /runs reads (413 beyond): a config is a few KiB; user code's options
    # and params have room, a data set does not.
    max_body_bytes: ClassVar[int] = 2**20
    name: str = Field("run", min_length=1, max_length=200, description="a name for people (the dashboard, fedctl)")
    seed: Int = Field(0, ge=0, lt=2**31, description="seeds selection, the partition, every batch order, the "
                      "initial weights and any noise: the same config and seed give the same model")
    # The algorithm and its params are checked by shared.core.algorithms.registry (`parse_config`, `check`),
    # where runs are created and where the reference runner starts: they need the algorithm's class,
    # and importing it here would make this plain model import torch (and close an import cycle).
    algorithm: str = Field("fedavg", description="the algorithm's name in shared/core/algorithms/registry.py")
    params: dict[str, Any] = Field(default_factory=dict, description="the algorithm's own settings, checked against "
                                   "its params model where the run is created")
    rounds: Int = Field(10, ge=1, le=100_000, description="T: global rounds")
    fraction: Float = Field(1.0, gt=0, le=1, description="lambda: client participation fraction")
    weighting: Literal["samples", "uniform"] = Field(
        "samples", description="p_k: option 1 |D_k|/sum |D_i| or option 2 1/m"
    )
    server_lr: Float = Field(1.0, gt=0, le=1000, description="eta_s")
    model: ModelConfig = Field(ModelConfig(), description="the model every client trains")
    data: DataConfig = Field(DataConfig(), description="the data set and how it is split over the clients")
    local: LocalTrainingConfig = Field(LocalTrainingConfig(), description="each client's local training")
    topology: TopologyConfig = Field(TopologyConfig(), description="edges, the cloud's buffer and edge rounds")
    policy: RoundPolicy = Field(RoundPolicy(), description="how long an edge waits for its clients, and what then")
    dvfs: DvfsConfig = Field(DvfsConfig(), description="each client's device and CPU frequency policy")
    aggregation: AggregationConfig = Field(AggregationConfig(), description="robust aggregation at the edge and "
                                           "the cloud")
    privacy: PrivacyConfig = Field(PrivacyConfig(), description="differential privacy: DP-FedAvg and DP-SGD")
    secure_aggregation: SecureAggregationConfig = Field(SecureAggregationConfig(), description="secure "
                                                        "aggregation: what each tier learns of the one below")
    evaluation: Literal["cloud", "federated", "both"] = Field("cloud", description=(
        "where the global model is evaluated: 'cloud', on the test set of data.dataset the cloud loads (the "
        "history's test_loss, test_accuracy); 'federated', by the devices that receive a version, on their own "
        "held-out splits before they train on it, weighted by samples at their edge and over the edges at the "
        "cloud (the history's `federated`); 'both'"))

    selection: Selection | None = Field(None, description=(
        "which registered sites and devices train (unset: the simulated federation of data.num_clients clients "
        "over topology.num_edges edges)"))
    max_samples_per_device: Int | None = Field(None, ge=1, le=10**12, description=(
        "A device's sample count cannot be checked where its data is its own: its claims weigh at most this many "
        "(unset: the edge's max_client_samples, if any). Robust aggregation (aggregation.edge/cloud) is the "
        "defence against a device that claims the most it may."))
    @model_validator(mode="before")
    @classmethod
    def _default_buffer_size(cls, data: Any) -> Any:
        """B left out of a config with several edges: every edge's contribution in each update for a synchronous
        algorithm (the only B it runs with), one for an asynchronous one (TopologyConfig's default)."""
        if not isinstance(data, dict):
            return data
        topology = data.get("topology")
        if isinstance(topology, TopologyConfig):
            given, edges = "buffer_size" in topology.model_fields_set, topology.num_edges
        elif isinstance(topology, dict):
            given, edges = "buffer_size" in topology, topology.get("num_edges", 1)
        else:
            return data
        if given or not isinstance(edges, int) or isinstance(edges, bool) or edges <= 1:
            return data
        # Imported here, and only for this case: the algorithm's module imports torch (see `algorithm` below).
        from fl_services.shared.core.algorithms.registry import get_algorithm_class

        try:
            synchronous = get_algorithm_class(str(data.get("algorithm", "fedavg"))).synchronous
        except ValueError:  # an unknown algorithm: the registry says so where the config is checked
            return data
        if not synchronous:
            return data
        fields = topology.model_dump(exclude_unset=True) if isinstance(topology, TopologyConfig) else topology
        return {**data, "topology": {**fields, "buffer_size": edges}}

    @model_validator(mode="after")
    def _check(self) -> "RunConfig":
        if self.selection is not None:
            self._check_selection()
        self._check_secure_aggregation()
        _check_finite(self.params, "params")
        if self.model.name in ("cnn", "flower_cnn") and self.data.dataset in ("synthetic", "mnist1d"):
            raise ValueError(f"the {self.model.name} needs images; {self.data.dataset} has 1-D features "
                             "(use logreg or mlp)")
        if self.selection is None and self.data.num_clients < self.topology.num_edges:
            raise ConfigError("topology.num_edges", f"every edge needs at least one client: {self.topology.num_edges} "
                              f"edges, {self.data.num_clients} clients")
        # A run over registered devices names its devices' dvfs by device id, whatever the ids.
        strangers = sorted(k for k in self.dvfs.clients if not 0 <= k < self.data.num_clients)
        if strangers and self.selection is None:
            raise ConfigError("dvfs.clients", f"dvfs.clients names clients {strangers} outside "
                              f"0..{self.data.num_clients - 1}")
        return self

    def _check_secure_aggregation(self) -> None:
        if self.secure_aggregation.edge and self.policy.answers == 1:
            # K ≥ 2 is coherent: the protocol's roster is the devices whose answers closed the round (edge/secagg.py).
            raise ValueError("secure_aggregation.edge with policy.answers = 1: each edge round would close at its "
                             "first answer, and a sum of one device's update is that update, which secure "
                             "aggregation hides (it needs at least 2 devices): set policy.answers ≥ 2, or leave it "
                             "unset")
        if not self.secure_aggregation.cloud:
            return
        if self.topology.buffer_size != self.topology.num_edges:
            raise ValueError(
                f"secure_aggregation.cloud needs topology.buffer_size = num_edges ({self.topology.num_edges}, got "
                f"{self.topology.buffer_size}): buffered averaging would weigh each site by its staleness s(τ), and "
                "the sites' pairwise masks cancel only in the sum over all of them, each counted once; a buffer of "
                "fewer would leave the cloud a masked, meaningless sum")
        if self.aggregation.cloud != "mean":
            raise ValueError(f"aggregation.cloud = {self.aggregation.cloud!r} needs each site's step, which "
                             "secure_aggregation.cloud hides: use 'mean'")

    def _check_selection(self) -> None:
        if self.privacy.dp_sgd_noise_multiplier is not None:
            raise ValueError("a run over registered devices (selection) takes no DP-SGD: its ε per example is "
                             "accounted from every client's sample count before the run, which devices holding "
                             "their own data do not give until they register")

    def edge_ids(self) -> list[int]:
        """The run's edges: the sites its selection resolved to, or the simulated federation's 0 … L−1."""
        if self.selection is not None and self.selection.edge_ids is not None:
            return list(self.selection.edge_ids)
        return list(range(self.topology.num_edges))

    def clients_of_edge(self, edge_index: int) -> list[int]:
        """The simulated federation's members of edge l: round-robin, k ≡ l (mod L). A launcher's binding (fedctl
        starts client k's process at edge k mod L; the reference runner replays it), not the protocol's: the edge
        service's members are the devices registered at it, which it declares with each contribution."""
        return list(range(edge_index, self.data.num_clients, self.topology.num_edges))

    def edge_of_client(self, client_id: int) -> int:
        return client_id % self.topology.num_edges


def _check_finite(value: Any, where: str) -> None:
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{where} must be a finite number, got {value}")
    if isinstance(value, dict):
        for key, item in value.items():
            _check_finite(item, f"{where}.{key}")
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            _check_finite(item, f"{where}[{i}]")
