"""Contributions' blobs as files in one directory, a volume every cloud replica mounts: written durably (the file
fsynced, renamed into place, the directory fsynced) before a backend references them, read by whichever replica
consumes them, deleted once consumed. Plain files, nothing of a backend's: the backend decides which files are
referenced (and so which aged ones are orphans: `aged` only lists candidates).

A file's name is a random token, never anything a request sent (a run id in a name would let a header pick a
path)."""
from __future__ import annotations

import os
import secrets
import time
from collections.abc import Iterable
from pathlib import Path

_SUFFIX = ".safetensors"
_PARTIAL = ".partial-"  # a file being written: renamed to its name once complete and fsynced


class BlobFiles:
    def __init__(self, directory: Path, namespace: str, orphan_s: float):
        # One subdirectory per key prefix: clouds (or test sessions) sharing a directory each sweep their own.
        self.directory = directory / namespace
        self.orphan_s = orphan_s

    def prepare(self) -> None:
        """Creates the directory (durably) if it is not there; OSError if it cannot be written (a read-only
        volume, a file in its place): found at start, not by the first submit."""
        if not self.directory.is_dir():
            self.directory.mkdir(parents=True, exist_ok=True)
            _fsync_directory(self.directory.parent)
        probe = self.new_name()  # written as a blob is (fsyncs included); an orphan, swept by age, if left
        self.write(probe, b"")
        self.delete([probe])

    @staticmethod
    def new_name() -> str:
        return secrets.token_hex(16) + _SUFFIX

    def write(self, name: str, blob: bytes) -> None:
        """`blob` under `name`, durable when this returns: a crash leaves either no file of that name or all of
        it (at worst a partial file under another name, swept by age)."""
        partial = self.directory / f"{_PARTIAL}{name}"
        try:
            with open(partial, "xb") as f:
                f.write(blob)
                f.flush()
                os.fsync(f.fileno())
            os.rename(partial, self.directory / name)
        except BaseException:
            partial.unlink(missing_ok=True)
            raise
        _fsync_directory(self.directory)

    def read(self, name: str) -> bytes:
        """FileNotFoundError if it is not there."""
        return (self.directory / name).read_bytes()

    def delete(self, names: Iterable[str]) -> None:
        for name in names:
            (self.directory / name).unlink(missing_ok=True)

    def aged(self) -> tuple[list[str], list[str]]:
        """The blobs (by name) and the partial files last written more than `orphan_s` ago."""
        before = time.time() - self.orphan_s
        blobs, partials = [], []
        with os.scandir(self.directory) as entries:
            for entry in entries:
                try:
                    if not entry.is_file() or entry.stat().st_mtime >= before:
                        continue
                except FileNotFoundError:  # deleted since it was listed (consumed by a replica)
                    continue
                if entry.name.startswith(_PARTIAL):
                    partials.append(entry.name)
                elif entry.name.endswith(_SUFFIX):
                    blobs.append(entry.name)
        return blobs, partials


def _fsync_directory(directory: Path) -> None:
    """Makes the directory's entries (a file created or renamed into it) durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
