"""Data sets a run names that a user supplies: an npz file, or an imported loader's arrays. Both are
checked before any training, so a malformed one fails where the run is created."""
from __future__ import annotations

import numpy as np

from fl_services.shared.core.config import DataConfig, is_import_path
from fl_services.shared.core.data.arrays import Pool, as_array, as_pair, check_samples
from fl_services.shared.core.user_code import UserCodeError, call

NPZ_REQUIRED = ("x_train", "y_train", "x_test", "y_test")
MAX_CLASSES = 100_000


def npz_pool(path: str) -> Pool:
    """Read and validate a user-supplied npz file."""
    loaded = np.load(path, allow_pickle=False)
    if not isinstance(loaded, np.lib.npyio.NpzFile):  # a single .npy array
        raise ValueError(f"{path} is not an npz archive (np.savez) but one array of shape {loaded.shape}")
    with loaded as archive:
        missing = [key for key in NPZ_REQUIRED if key not in archive.files]
        if missing:
            raise ValueError(f"{path} lacks arrays {missing}; it has {sorted(archive.files)}")
        wanted = (*NPZ_REQUIRED, "client_train")
        arrays = {key: archive[key] for key in wanted if key in archive.files}
    return _validated_pool(arrays)


def _validated_pool(arrays: dict[str, np.ndarray], num_classes: int | None = None) -> Pool:
    """The checks every user-supplied data set passes (an npz file, an imported loader's arrays)."""
    for split in ("train", "test"):
        check_samples(arrays[f"x_{split}"], arrays[f"y_{split}"], f"x_{split}", f"y_{split}")
    if arrays["x_train"].shape[1:] != arrays["x_test"].shape[1:]:
        raise ValueError(
            f"x_train samples have shape {arrays['x_train'].shape[1:]} "
            f"but x_test samples have shape {arrays['x_test'].shape[1:]}"
        )
    client_train = arrays.get("client_train")
    if client_train is not None:
        if client_train.ndim != 1 or not np.issubdtype(client_train.dtype, np.integer):
            raise ValueError(
                "client_train must be a 1-D integer array, "
                f"got {client_train.dtype} of shape {client_train.shape}"
            )
        if len(client_train) != len(arrays["x_train"]):
            raise ValueError(
                f"client_train has {len(client_train)} entries "
                f"for {len(arrays['x_train'])} training samples"
            )
    largest = max(int(arrays["y_train"].max()), int(arrays["y_test"].max()))
    if num_classes is not None:
        if not isinstance(num_classes, (int, np.integer)) or num_classes <= largest:
            raise ValueError(f"num_classes {num_classes!r} must be an integer above the largest label {largest}")
    classes = largest + 1 if num_classes is None else int(num_classes)
    if classes > MAX_CLASSES:
        # Checked before any model is built: labels that are raw ids (20231124) gave a model of that many
        # outputs, whose gigabytes the cloud allocated before it could refuse the run's size.
        raise ValueError(f"{classes} classes (labels 0 to {classes - 1}), over the {MAX_CLASSES} allowed: "
                         "labels must be 0 … C−1")
    return Pool(arrays["x_train"], arrays["y_train"], arrays["x_test"], arrays["y_test"], client_train,
                None if num_classes is None else int(num_classes))


def imported_pool(cfg: DataConfig) -> Pool:
    """The researcher's loader, `load(**cfg.options)`, which returns either

    - a mapping with x_train, y_train, x_test, y_test (numpy arrays or torch tensors; x of shape (N, ...),
      y integer labels 0..C-1 of shape (N,)), optionally client_train (one client id per training row,
      used by partition "file") and num_classes (else the largest label + 1);
    - or a tuple (train, test) or (train, test, client_train), each split an (x, y) pair or a torch
      Dataset of (x, y) samples (read once into tensors).

    It must be deterministic (a function of its options): every process calls it and they must agree.
    Each process calls it once per (config, seed), through load_federated's cache.
    """
    assert is_import_path(cfg.dataset)
    loaded = call(cfg.dataset, "data loader", **cfg.options)
    try:
        if isinstance(loaded, dict):
            missing = [key for key in NPZ_REQUIRED if key not in loaded]
            if missing:
                raise ValueError(f"its result lacks {missing}; it has {sorted(loaded)}")
            arrays = {key: as_array(loaded[key], key) for key in (*NPZ_REQUIRED, "client_train") if key in loaded}
            num_classes = loaded.get("num_classes")
        elif isinstance(loaded, tuple) and len(loaded) in (2, 3):
            (x_train, y_train), (x_test, y_test) = as_pair(loaded[0], "train"), as_pair(loaded[1], "test")
            arrays = {"x_train": x_train, "y_train": y_train, "x_test": x_test, "y_test": y_test}
            if len(loaded) == 3:
                arrays["client_train"] = as_array(loaded[2], "client_train")
            num_classes = None
        else:
            raise ValueError(f"it returned a {type(loaded).__name__}, not a dict of arrays or a (train, test"
                             "[, client_train]) tuple")
        return _validated_pool(arrays, num_classes)
    except (ValueError, TypeError) as exc:
        raise UserCodeError(f"the data loader {cfg.dataset!r}: {exc}") from exc
