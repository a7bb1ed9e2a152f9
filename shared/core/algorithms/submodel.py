"""Rolling-window sub-models (FedRolex, Alam et al. 2022) as plain tensor functions.

A hidden layer with K units (a conv layer: K filters) gives a client of capacity β ∈ (0, 1] the
rolling window of n = max(⌊β·K⌋, 1) units starting at r mod K in round r, wrapping around:
{r mod K, …, (r mod K) + n − 1} mod K. Each hidden layer rolls with its own K. The input of the first
layer and the output of the last stay whole, so a sub-model is the same architecture built narrower
(`build_model(..., **widths)`) and a client trains it with the ordinary local loop.

Which tensor dimension is indexed by which hidden layer is data (`ARCHITECTURES`): dim 0 of a layer's
weight and its bias are its own units, dim 1 of the next layer's weight is the previous layer's units.
Where a dimension is `block` times longer than the layer it follows (the CNN's fc1 reads conv2's
output flattened channel-major: feature = channel·S + position, S spatial positions after pooling),
each unit covers `block` consecutive coordinates; the block is inferred from the full shapes.

A window is kept as the *sorted* set of its unit indices: the order of hidden units inside a
sub-model does not change the function it computes, and keeping global order makes β = 1 extract the
global model itself (so full-capacity FedRolex is FedAvg exactly, not up to float summation order).
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from fl_services.shared.core.config import ModelConfig
from fl_services.shared.core.tensors import Tensors

Shapes = Mapping[str, tuple[int, ...]]
Windows = dict[str, torch.Tensor]  # hidden layer -> sorted int64 unit indices
Masks = dict[str, torch.Tensor]  # parameter -> bool, True where the window covers the coordinate


@dataclass(frozen=True)
class HiddenLayer:
    name: str  # the module whose output units (the rows of "<name>.weight") form the layer
    width_arg: str  # the build_model keyword that sets its width


@dataclass(frozen=True)
class Architecture:
    hidden: tuple[HiddenLayer, ...]
    # parameter -> per tensor dimension, the hidden layer that indexes it (None: the dimension stays whole)
    axes: Mapping[str, tuple[str | None, ...]]

    def units(self, shapes: Shapes) -> dict[str, int]:
        """K of every hidden layer, read from (full or sub) parameter shapes."""
        return {h.name: shapes[f"{h.name}.weight"][0] for h in self.hidden}

    def widths(self, shapes: Shapes) -> dict[str, int]:
        """The build_model keywords that build a model with these parameter shapes."""
        units = self.units(shapes)
        return {h.width_arg: units[h.name] for h in self.hidden}


def mlp_architecture(num_hidden: int) -> Architecture:
    """The MLP with `num_hidden` hidden layers fc1 ... fcN (widths hidden1 ... hiddenN) and output fc(N+1)."""
    fc = [f"fc{i + 1}" for i in range(num_hidden + 1)]
    axes: dict[str, tuple[str | None, ...]] = {}
    for i, name in enumerate(fc):
        out = name if i < num_hidden else None
        axes[f"{name}.weight"] = (out, fc[i - 1] if i else None)
        axes[f"{name}.bias"] = (out,)
    return Architecture(hidden=tuple(HiddenLayer(fc[i], f"hidden{i + 1}") for i in range(num_hidden)), axes=axes)


ARCHITECTURES: dict[str, Architecture] = {
    "logreg": Architecture(hidden=(), axes={"linear.weight": (None, None), "linear.bias": (None,)}),
    "mlp": mlp_architecture(2),
    "cnn": Architecture(
        hidden=(HiddenLayer("conv1", "conv1"), HiddenLayer("conv2", "conv2"), HiddenLayer("fc1", "hidden")),
        axes={
            "conv1.weight": ("conv1", None, None, None), "conv1.bias": ("conv1",),
            "conv2.weight": ("conv2", "conv1", None, None), "conv2.bias": ("conv2",),
            "fc1.weight": ("fc1", "conv2"),  # conv2's units expand to blocks of S = H/4·W/4 features
            "fc1.bias": ("fc1",),
            "fc2.weight": (None, "fc1"), "fc2.bias": (None,),
        },
    ),
}


def architecture_of(model: ModelConfig) -> Architecture:
    """The run's model as hidden layers to roll; an imported factory's layers are unknown here, so its
    models cannot be cut into sub-models (a ValueError: the cloud refuses such a run at creation)."""
    if model.name == "mlp":
        return mlp_architecture(len(model.hidden))
    if model.name not in ARCHITECTURES:
        raise ValueError(f"sub-models need a built-in model (logreg, mlp, cnn) whose hidden layers can be "
                         f"narrowed; the imported model {model.name!r} cannot be")
    return ARCHITECTURES[model.name]


def window_size(num_units: int, capacity: float) -> int:
    """n = max(⌊β·K⌋, 1); the epsilon keeps e.g. 0.29·100 = 28.999… from flooring to 28."""
    if not 0 < capacity <= 1:
        raise ValueError(f"capacity must lie in (0, 1], got {capacity}")
    return max(math.floor(capacity * num_units + 1e-9), 1)


def window_indices(num_units: int, capacity: float, round: int) -> list[int]:
    """The rolling window in the specification's order: n units from r mod K, wrapping around."""
    start = round % num_units
    return [(start + i) % num_units for i in range(window_size(num_units, capacity))]


def layer_windows(arch: Architecture, full_shapes: Shapes, capacity: float, round: int) -> Windows:
    """Every hidden layer's window for a client of `capacity` in `round`, as sorted index tensors."""
    return {
        name: torch.tensor(sorted(window_indices(k, capacity, round)), dtype=torch.int64)
        for name, k in arch.units(full_shapes).items()
    }


def _coordinates(
    arch: Architecture, name: str, full_shape: tuple[int, ...], units: Mapping[str, int], windows: Windows
) -> tuple[torch.Tensor, ...]:
    """Broadcastable index tensors that pick the window's sub-tensor out of a full-size tensor."""
    axes = arch.axes[name]
    if len(axes) != len(full_shape):
        raise ValueError(f"{name} has shape {full_shape}, the architecture expects {len(axes)} dimensions")
    index = []
    for dim, (layer, size) in enumerate(zip(axes, full_shape, strict=True)):
        if layer is None:
            idx = torch.arange(size)
        else:
            block, rest = divmod(size, units[layer])
            if rest:
                raise ValueError(f"{name} dim {dim} ({size}) is not a multiple of {layer}'s {units[layer]} units")
            idx = (windows[layer].unsqueeze(1) * block + torch.arange(block)).flatten()
        index.append(idx.view([-1 if d == dim else 1 for d in range(len(full_shape))]))
    return tuple(index)


def extract(full: Tensors, arch: Architecture, windows: Windows) -> Tensors:
    """The sub-model's tensors: every parameter restricted to the windows (contiguous copies)."""
    shapes = {name: tuple(t.shape) for name, t in full.items()}
    units = arch.units(shapes)
    return {name: t[_coordinates(arch, name, shapes[name], units, windows)].contiguous() for name, t in full.items()}


def coverage(arch: Architecture, windows: Windows, full_shapes: Shapes) -> Masks:
    """Where the windows cover each full-size parameter."""
    units = arch.units(full_shapes)
    masks: Masks = {}
    for name, shape in full_shapes.items():
        mask = torch.zeros(tuple(shape), dtype=torch.bool)
        mask[_coordinates(arch, name, tuple(shape), units, windows)] = True
        masks[name] = mask
    return masks


def embed(sub: Tensors, arch: Architecture, windows: Windows, full_shapes: Shapes) -> tuple[Tensors, Masks]:
    """Sub-model tensors placed at their window in full-size tensors (zero elsewhere), plus where."""
    units = arch.units(full_shapes)
    out: Tensors = {}
    masks: Masks = {}
    for name, t in sub.items():
        shape = tuple(full_shapes[name])
        at = _coordinates(arch, name, shape, units, windows)
        expected = tuple(i.numel() for i in at)
        if tuple(t.shape) != expected:
            raise ValueError(f"{name} has shape {tuple(t.shape)}, its window has shape {expected}")
        full = torch.zeros(shape, dtype=t.dtype, device=t.device)
        mask = torch.zeros(shape, dtype=torch.bool, device=t.device)
        full[at] = t
        mask[at] = True
        out[name], masks[name] = full, mask
    return out, masks
