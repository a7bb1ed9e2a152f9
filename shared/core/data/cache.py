"""Generated or parsed data sets kept on local disk, so only the first process on a machine builds them."""
from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Callable

import numpy as np

from fl_services.shared.runtime.files import atomic_write


def cache_path(name: str) -> Path:
    root = Path(os.environ.get("FL_DATA_CACHE", Path.home() / ".cache" / "fl-datasets"))
    return root / f"{name}-v1.npz"


def disk_cached(name: str, build: Callable[[], tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """`build()`'s arrays, read-only, from the local .npz cache when an earlier process wrote them (plain
    arrays, no pickle)."""
    cache = cache_path(name)
    try:
        with np.load(cache, allow_pickle=False) as archive:
            x, y = archive["x"], archive["y"]
    except (OSError, KeyError, ValueError):
        x, y = build()
        archive = io.BytesIO()
        np.savez(archive, x=x, y=y)
        try:
            atomic_write(cache, archive.getvalue())  # processes that build it at once each write it whole
        except OSError:
            pass  # a read-only home only costs the rebuild
    x.flags.writeable = y.flags.writeable = False
    return x, y
