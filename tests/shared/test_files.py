"""atomic_write: the file holds the old content or the new, whole, whatever happens while it is written."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fl_services.shared.runtime.files import atomic_write


def test_writes_replaces_and_creates_the_directory(tmp_path):
    path = tmp_path / "a" / "b" / "state.bin"
    atomic_write(path, b"first")
    atomic_write(path, b"second")
    assert path.read_bytes() == b"second"
    assert [p.name for p in path.parent.iterdir()] == ["state.bin"]  # no temporary file left


def test_the_data_is_fsynced_before_the_rename(tmp_path, monkeypatch):
    path = tmp_path / "state.bin"
    events: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(os, "fsync", lambda fd: (events.append(f"fsync {os.fstat(fd).st_size}"), real_fsync(fd)))
    monkeypatch.setattr(os, "replace", lambda a, b: (events.append("replace"), real_replace(a, b)))
    atomic_write(path, b"12345")
    assert events == ["fsync 5", "replace"]  # the whole data on disk before the new name points at it
    events.clear()
    atomic_write(path, b"123", fsync=False)
    assert events == ["replace"] and path.read_bytes() == b"123"


def test_a_write_that_fails_leaves_the_old_content_and_no_debris(tmp_path, monkeypatch):
    path = tmp_path / "state.bin"
    atomic_write(path, b"old")

    def full_disk(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", full_disk)
    with pytest.raises(OSError, match="No space"):
        atomic_write(path, b"new" * 1000)
    assert path.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["state.bin"]


WRITER = """
import sys
from pathlib import Path
from fl_services.shared.runtime.files import atomic_write
path, size = Path(sys.argv[1]), int(sys.argv[2])
i = 0
while True:
    i += 1
    atomic_write(path, bytes([i % 256]) * size)
    if i == 2:
        print("writing", flush=True)
"""


def test_a_process_killed_while_writing_leaves_a_whole_file(tmp_path):
    """SIGKILLed at arbitrary moments of back-to-back 4 MiB writes: every time, the file is one write whole."""
    path, size = tmp_path / "state.bin", 4 * 2**20
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    for delay in (0.0, 0.013, 0.031, 0.057, 0.089):
        writer = subprocess.Popen([sys.executable, "-c", WRITER, str(path), str(size)], env=env,
                                  stdout=subprocess.PIPE, text=True)
        assert writer.stdout.readline() == "writing\n"
        time.sleep(delay)
        writer.send_signal(signal.SIGKILL)
        writer.wait()
        data = path.read_bytes()
        assert len(data) == size and data == data[:1] * size, f"a torn file after {delay} s"
