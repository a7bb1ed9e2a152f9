"""Files written whole or not at all: what every service keeps on its own disk goes through here."""
from __future__ import annotations

import os
import threading
from pathlib import Path


def write_private(path: Path, data: bytes) -> None:
    """Writes `path` (replacing it) created readable and writable by its owner only, from the first byte on:
    keys and tokens, which a chmod after the write would leave readable to others for a moment."""
    path = Path(path)
    path.unlink(missing_ok=True)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "wb") as out:
        out.write(data)


def atomic_write(path: Path, data: bytes, fsync: bool = True) -> None:
    """Replaces `path` by `data` so that a reader, or the disk after a crash, sees the old or the new file.

    The data goes to a temporary file beside `path` (named per process and thread, so concurrent writers
    of one path do not mix their bytes) and is renamed over it, which POSIX makes atomic. With `fsync`
    the data reaches the disk before the rename does: without it, a host crash can leave the new name on
    an empty or partial file, since the file system may journal the rename before it writes the data.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            if fsync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
