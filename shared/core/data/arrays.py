"""Data held in memory as arrays, and the checks and conversions every source of it shares."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class ArrayDataset:
    """Features and labels held in memory; small enough that a DataLoader adds nothing."""

    x: torch.Tensor  # float32, shape (N, *input_shape)
    y: torch.Tensor  # int64, shape (N,)

    def __post_init__(self) -> None:
        if self.x.dtype != torch.float32 or self.y.dtype != torch.int64:
            raise TypeError(f"need float32 x and int64 y, got {self.x.dtype} and {self.y.dtype}")
        if self.y.ndim != 1 or self.x.shape[0] != self.y.shape[0]:
            raise ValueError(f"x {tuple(self.x.shape)} and y {tuple(self.y.shape)} do not match")

    def __len__(self) -> int:
        return self.y.shape[0]


@dataclass(frozen=True)
class ClientData:
    """One client's data; `test` is its own held-out split, for personalised evaluation."""

    train: ArrayDataset
    test: ArrayDataset


@dataclass(frozen=True)
class Pool:
    """A data set before partitioning: the training pool in original order and the global test set."""

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    client_train: np.ndarray | None = None
    # Fixed by the generator, so a small split that happens to miss a class keeps the model's shape.
    num_classes: int | None = None


def to_dataset(x: np.ndarray, y: np.ndarray) -> ArrayDataset:
    # np.array copies, so no tensor aliases a cached or caller-owned array.
    return ArrayDataset(
        torch.from_numpy(np.array(x, dtype=np.float32)),
        torch.from_numpy(np.array(y, dtype=np.int64)),
    )


def hold_out(indices: np.ndarray, share: float, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Hold out a random `share` of `indices` (at least one, and never all, unless the share is 0); both halves
    keep ascending original order, so training depends on the draw only through which samples are held out."""
    n = len(indices)
    num_held_out = min(max(round(n * share), 1), n - 1) if n >= 2 and share > 0 else 0
    held_out = np.zeros(n, dtype=bool)
    held_out[rng.choice(n, num_held_out, replace=False)] = True
    return indices[~held_out], indices[held_out]


# The largest finite float32: a larger value of a wider type becomes infinite when a sample is made float32.
_FLOAT32_MAX = float(np.finfo(np.float32).max)
_INT64_MAX = int(np.iinfo(np.int64).max)


def check_labels(y: np.ndarray, name: str) -> None:
    if y.ndim != 1 or not np.issubdtype(y.dtype, np.integer):
        raise ValueError(f"{name} must be a 1-D integer array, got {y.dtype} of shape {y.shape}")
    if len(y) and y.min() < 0:
        raise ValueError(f"{name} has negative labels")
    if len(y) and int(y.max()) > _INT64_MAX:  # an unsigned label that int64 would wrap to a negative one
        raise ValueError(f"{name} has labels beyond {_INT64_MAX}")


def check_samples(x: np.ndarray, y: np.ndarray, x_name: str, y_name: str) -> None:
    """What any split a user supplies must be: N ≥ 1 finite numeric samples of shape (N, ...) and N labels."""
    if x.ndim < 2 or len(x) == 0:
        raise ValueError(f"{x_name} must have shape (N, ...) with N >= 1, got {x.shape}")
    if not (np.issubdtype(x.dtype, np.number) or x.dtype == np.bool_):
        raise ValueError(f"{x_name} must be numeric, got dtype {x.dtype}")
    if np.issubdtype(x.dtype, np.complexfloating):  # made float32, it would lose its imaginary part silently
        raise ValueError(f"{x_name} must be real numbers, got dtype {x.dtype}")
    if np.issubdtype(x.dtype, np.inexact) and not np.isfinite(x).all():
        # Training on it gives non-finite updates, which the cloud refuses: the run could never move.
        raise ValueError(f"{x_name} holds NaN or infinite values")
    if x.dtype.itemsize > 4 and np.issubdtype(x.dtype, np.floating) and np.abs(x).max() > _FLOAT32_MAX:
        # Finite here, infinite once the samples are float32, with the same end.
        raise ValueError(f"{x_name} holds values beyond float32's range (±{_FLOAT32_MAX:.3g})")
    check_labels(y, y_name)
    if len(y) != len(x):
        raise ValueError(f"{y_name} has {len(y)} labels for {len(x)} samples in {x_name}")


def as_array(value: object, name: str) -> np.ndarray:
    """A numpy array from a numpy array, a torch tensor or a nested list (a loader's output)."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().numpy()
    array = np.asarray(value)
    if array.dtype == object:
        raise ValueError(f"{name} is not a numeric array (got {type(value).__name__})")
    return array


def as_pair(split: object, name: str) -> tuple[np.ndarray, np.ndarray]:
    """(x, y) from an (x, y) pair or a torch Dataset of (x, y) samples, materialised as arrays."""
    if isinstance(split, torch.utils.data.Dataset):
        if isinstance(split, torch.utils.data.TensorDataset) and len(split.tensors) == 2:
            x, y = split.tensors
        else:
            samples = [split[i] for i in range(len(split))]  # type: ignore[arg-type]
            if not samples:
                raise ValueError(f"the {name} Dataset is empty")
            x = torch.stack([torch.as_tensor(sample[0]) for sample in samples])
            y = torch.as_tensor([int(sample[1]) for sample in samples])
        return as_array(x, f"x_{name}"), as_array(y, f"y_{name}")
    if not isinstance(split, (tuple, list)) or len(split) != 2:
        raise ValueError(f"the {name} split must be an (x, y) pair or a torch Dataset, got {type(split).__name__}")
    return as_array(split[0], f"x_{name}"), as_array(split[1], f"y_{name}")
