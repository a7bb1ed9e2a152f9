"""The model zoo. Parameter names are part of the wire format: tensors travel by these names.

Parameters (name: shape for MNIST 1x28x28, 10 classes):
- logreg: linear.weight [10, 784], linear.bias [10]
- mlp (McMahan's 2NN): fc1.weight [200, 784], fc1.bias, fc2.weight [200, 200], fc2.bias, fc3.weight [10, 200],
  fc3.bias; with model.hidden = [h1, ..., hn]: fc1 ... fc(n+1), fc(i).weight [h_i, h_(i-1)]
- cnn: conv1.weight [16, 1, 3, 3], conv1.bias, conv2.weight [32, 16, 3, 3], conv2.bias, fc1.weight [64, 32*7*7],
  fc1.bias, fc2.weight [10, 64], fc2.bias
- flower_cnn (the CNN of Flower's PyTorch quickstart, for 1-channel 28x28 inputs): conv1.weight [6, 1, 5, 5],
  conv1.bias, conv2.weight [16, 6, 5, 5], conv2.bias, fc1.weight [120, 16*4*4], fc1.bias, fc2.weight [84, 120],
  fc2.bias, fc3.weight [10, 84], fc3.bias
- "package.module:factory": whatever the researcher's nn.Module names its parameters. The contract:
  `factory(input_shape: tuple[int, ...], num_classes: int, **model.options) -> nn.Module`, where input_shape
  is one sample's shape (e.g. (1, 28, 28)); the module maps a float32 batch (N, *input_shape) to logits
  (N, num_classes). It is called under the run's seeded generator, like the built-ins, so every process
  builds the same initial weights as long as the factory draws randomness only from torch's default
  generator (nn.init does).
"""
from __future__ import annotations

import copy
import functools
import itertools
import math
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from fl_services.shared.core.config import ModelConfig, is_import_path
from fl_services.shared.core.seeding import seeded_default_generator
from fl_services.shared.core.user_code import UserCodeError, call


class LogReg(nn.Module):
    def __init__(self, input_shape: tuple[int, ...], num_classes: int):
        super().__init__()
        self.linear = nn.Linear(math.prod(input_shape), num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x.flatten(1))


def mlp_sizes(input_shape: tuple[int, ...], num_classes: int, hidden: Sequence[int]) -> list[int]:
    """The widths of the MLP's layers, input to logits."""
    return [math.prod(input_shape), *hidden, num_classes]


def mlp_parameters(input_shape: tuple[int, ...], num_classes: int, hidden: Sequence[int]) -> int:
    """How many parameters the MLP has (weights and biases), known before any is allocated."""
    sizes = mlp_sizes(input_shape, num_classes, hidden)
    return sum((fan_in + 1) * fan_out for fan_in, fan_out in itertools.pairwise(sizes))


class MLP(nn.Module):
    """McMahan et al.'s 2NN by default: hidden ReLU layers of the given sizes (200, 200), narrower for FedRolex
    sub-models. Layers are fc1 ... fc(n+1), created in that order, so the 2NN's weights stay what they were."""

    def __init__(self, input_shape: tuple[int, ...], num_classes: int, hidden: Sequence[int] = (200, 200)):
        super().__init__()
        sizes = mlp_sizes(input_shape, num_classes, hidden)
        self.num_layers = len(sizes) - 1
        for i in range(self.num_layers):
            # Attributes, not a ModuleList: the parameter names (fc1.weight...) are the wire format.
            setattr(self, f"fc{i + 1}", nn.Linear(sizes[i], sizes[i + 1]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.flatten(1)
        for i in range(1, self.num_layers):
            x = F.relu(getattr(self, f"fc{i}")(x))
        return getattr(self, f"fc{self.num_layers}")(x)


class CNN(nn.Module):
    """Two 3x3 conv blocks and two dense layers: small enough that ten clients train on one CPU core.

    Padding keeps spatial sizes divisible by 4, so the same net fits 28x28 MNIST and 8x8 digits.
    """

    def __init__(self, input_shape: tuple[int, ...], num_classes: int, conv1: int = 16, conv2: int = 32,
                 hidden: int = 64):
        super().__init__()
        channels, height, width = input_shape
        self.conv1 = nn.Conv2d(channels, conv1, 3, padding=1)
        self.conv2 = nn.Conv2d(conv1, conv2, 3, padding=1)
        self.fc1 = nn.Linear(conv2 * (height // 4) * (width // 4), hidden)
        self.fc2 = nn.Linear(hidden, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


class FlowerCNN(nn.Module):
    """The CNN of Flower's PyTorch quickstart (two 5x5 conv + max-pool blocks, dense 120 and 84), with the
    flattened size computed from the input, so runs can be compared with Flower's simulation one to one."""

    def __init__(self, input_shape: tuple[int, ...], num_classes: int):
        super().__init__()
        channels, height, width = input_shape
        if min(height, width) < 16:
            raise ValueError(f"flower_cnn needs inputs of at least 16x16 pixels, got {height}x{width}")
        self.conv1 = nn.Conv2d(channels, 6, 5)
        self.conv2 = nn.Conv2d(6, 16, 5)
        def pooled(size: int) -> int:  # after conv 5x5, pool 2, conv 5x5, pool 2
            return ((size - 4) // 2 - 4) // 2

        self.fc1 = nn.Linear(16 * pooled(height) * pooled(width), 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x.flatten(1))))))


def build_model(cfg: ModelConfig, input_shape: tuple[int, ...], num_classes: int, seed: int = 0,
                **widths: int) -> nn.Module:
    """Builds the model with weights drawn from a generator seeded by `seed` (the caller's RNG untouched).

    `widths` narrows hidden layers (MLP: hidden1 ... hiddenN; CNN: conv1, conv2, hidden) for sub-models.
    An imported factory (cfg.name "package.module:factory") is called as documented above; whatever
    fails in it raises UserCodeError.
    """
    if is_import_path(cfg.name):
        if widths:
            raise ValueError(f"the imported model {cfg.name!r} cannot be narrowed into sub-models")
        with seeded_default_generator(seed):
            model = call(cfg.name, "model factory", tuple(input_shape), num_classes, **cfg.options)
        if not isinstance(model, nn.Module):
            raise UserCodeError(f"the model factory {cfg.name!r} returned a {type(model).__name__}, not a torch "
                                "nn.Module")
        return model
    # A copy of the one built for these arguments: seeding and drawing the initial weights cost more than
    # the local update of a small client, which overwrites them anyway (built-in models only: an imported
    # factory may not be copyable, or may mean to be called each time).
    return copy.deepcopy(_builtin(cfg, tuple(input_shape), num_classes, seed, tuple(sorted(widths.items()))))


@functools.lru_cache(maxsize=32)
def _builtin(cfg: ModelConfig, input_shape: tuple[int, ...], num_classes: int, seed: int,
             widths: tuple[tuple[str, int], ...]) -> nn.Module:
    """A built-in model as `build_model` describes it; shared through the cache: never handed out itself."""
    if cfg.name in ("cnn", "flower_cnn") and len(input_shape) != 3:
        raise ValueError(f"{cfg.name} needs (channels, height, width) inputs, got {input_shape}")
    narrowed = dict(widths)
    with seeded_default_generator(seed):
        if cfg.name == "mlp":
            hidden = [narrowed.pop(f"hidden{i + 1}", size) for i, size in enumerate(cfg.hidden)]
            if narrowed:
                raise TypeError(f"the mlp has no widths {sorted(narrowed)}")
            return MLP(input_shape, num_classes, hidden)
        cls = {"logreg": LogReg, "cnn": CNN, "flower_cnn": FlowerCNN}[cfg.name]
        return cls(input_shape, num_classes, **narrowed)


# ---- feature extractors f_i: x -> R^d, for prototype learning with heterogeneous clients ------------

class MLPFeatures(nn.Module):
    """Two hidden ReLU layers, then a linear map to the shared feature space."""

    def __init__(self, input_shape: tuple[int, ...], dim: int, hidden: int = 200):
        super().__init__()
        self.fc1 = nn.Linear(math.prod(input_shape), hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.out = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(F.relu(self.fc2(F.relu(self.fc1(x.flatten(1))))))


class ConvFeatures(nn.Module):
    """`depth` conv blocks of 3x3 convolutions with 2x2 max-pooling after the first two, then dense."""

    def __init__(self, input_shape: tuple[int, ...], dim: int, channels: tuple[int, ...], hidden: int):
        super().__init__()
        c, h, w = input_shape
        layers: list[nn.Module] = []
        for i, out in enumerate(channels):
            layers += [nn.Conv2d(c, out, 3, padding=1), nn.ReLU()]
            if i < 2:
                layers.append(nn.MaxPool2d(2))
                h, w = h // 2, w // 2
            c = out
        self.conv = nn.Sequential(*layers)
        self.fc = nn.Linear(c * h * w, hidden)
        self.out = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(F.relu(self.fc(self.conv(x).flatten(1))))


# The families a prototype-learning run may mix; their parameter names differ, only d is shared.
FEATURE_FAMILIES: dict[str, Callable[[tuple[int, ...], int], nn.Module]] = {
    "mlp": lambda shape, dim: MLPFeatures(shape, dim),
    "cnn": lambda shape, dim: ConvFeatures(shape, dim, channels=(16, 32), hidden=128),
    "cnn_deep": lambda shape, dim: ConvFeatures(shape, dim, channels=(32, 64, 64), hidden=128),
}
IMAGE_FAMILIES = {"cnn", "cnn_deep"}


def build_feature_extractor(family: str, input_shape: tuple[int, ...], dim: int, seed: int) -> nn.Module:
    if family in IMAGE_FAMILIES and len(input_shape) != 3:
        raise ValueError(f"{family} needs (channels, height, width) inputs, got {input_shape}")
    with seeded_default_generator(seed):
        return FEATURE_FAMILIES[family](input_shape, dim)
