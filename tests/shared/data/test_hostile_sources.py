"""A device's own data that is broken or hostile: each gives a DataSourceError saying what is wrong, never another
exception, a hang, memory without end, or a sample that trains as NaN or infinity."""
from __future__ import annotations

import io
import os
import struct
import threading
import zipfile
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from fl_services.shared.core.data import DataSourceError, local, open_source

# ---- npz ----


def npy_header(shape: tuple[int, ...], descr: str = "<f4") -> bytes:
    """An .npy header (format 1.0) declaring `shape`, padded as numpy pads it."""
    text = f"{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}"
    text += " " * (64 - (10 + len(text) + 1) % 64) + "\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(text)) + text.encode()


def npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


def zip_of(path: Path, members: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return path


def refused(spec: str, fragment: str) -> None:
    with pytest.raises(DataSourceError) as raised:
        open_source(spec).load()
    assert fragment in str(raised.value), str(raised.value)


def test_a_truncated_archive_is_not_an_npz(tmp_path):
    buffer = io.BytesIO()
    np.savez(buffer, x=np.zeros((4, 2)), y=np.zeros(4, int))
    (tmp_path / "cut.npz").write_bytes(buffer.getvalue()[:60])
    refused(f"npz:{tmp_path / 'cut.npz'}", "is not an npz archive")


def test_a_member_that_is_no_array_is_named(tmp_path):
    path = zip_of(tmp_path / "junk.npz", {"x.npy": b"hello world", "y.npy": npy(np.zeros(4, int))})
    refused(f"npz:{path}", "x is not a numpy array")


def test_an_array_declaring_more_than_it_holds_is_refused_before_memory_is_taken(tmp_path):
    header = npy_header((10**11, 4))
    path = zip_of(tmp_path / "huge.npz", {"x.npy": header + bytes(64), "y.npy": npy(np.zeros(4, int))})
    refused(f"npz:{path}", "x declares shape (100000000000, 4)")


@pytest.mark.parametrize("x, y, fragment", [
    (np.array([{"a": 1}, {"b": 2}], dtype=object), np.zeros(2, int), "holds Python objects, which are never unpickled"),
    (np.zeros((2, 3)), np.array([{"a": 1}, 2], dtype=object), "holds Python objects, which are never unpickled"),
    (np.full((2, 3), 1e300), np.zeros(2, int), "beyond float32's range"),
    (np.zeros((2, 3), dtype=np.complex128), np.zeros(2, int), "must be real numbers"),
    (np.zeros((2, 3)), np.full(2, 2**64 - 1, dtype=np.uint64), "labels beyond"),
])
def test_arrays_that_cannot_train_are_refused(tmp_path, x, y, fragment):
    path = zip_of(tmp_path / "bad.npz", {"x.npy": npy(x) if x.dtype != object else _object_npy(x),
                                         "y.npy": npy(y) if y.dtype != object else _object_npy(y)})
    refused(f"npz:{path}", fragment)


def _object_npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=True)
    return buffer.getvalue()


def test_a_pickled_object_array_is_never_unpickled(tmp_path):
    # Unpickling this would create the marker file.
    marker = tmp_path / "unpickled"

    class Payload:
        def __reduce__(self):
            return (Path.touch, (marker,))

    path = zip_of(tmp_path / "evil.npz", {"x.npy": _object_npy(np.array([Payload()], dtype=object)),
                                          "y.npy": npy(np.zeros(1, int))})
    refused(f"npz:{path}", "holds Python objects")
    assert not marker.exists()


def finishes(spec: str, seconds: float = 10.0) -> BaseException | None:
    """Loads `spec` in a thread; fails the test if it has not finished within `seconds`."""
    outcome: list[BaseException | None] = []

    def load() -> None:
        try:
            open_source(spec).load()
            outcome.append(None)
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            outcome.append(exc)

    thread = threading.Thread(target=load, daemon=True)
    thread.start()
    thread.join(seconds)
    assert outcome, f"{spec} still loading after {seconds} s"
    return outcome[0]


@pytest.mark.parametrize("kind, name", [("npz", "site.npz"), ("csv", "t.csv"), ("image-folder", "0/a.png")])
def test_a_fifo_is_refused_not_waited_on(tmp_path, kind, name):
    fifo = tmp_path / "data" / name
    fifo.parent.mkdir(parents=True)
    os.mkfifo(fifo)
    spec = f"image-folder:{tmp_path / 'data'}?shape=1x4x4" if kind == "image-folder" else f"{kind}:{fifo}"
    exc = finishes(spec)
    assert isinstance(exc, DataSourceError) and "is not a regular file" in str(exc), exc


# ---- csv ----

def test_a_field_beyond_the_csv_modules_limit_is_named(tmp_path):
    (tmp_path / "t.csv").write_text("a,label\n" + "1" * 200_000 + ",0\n2,1\n")
    refused(f"csv:{tmp_path / 't.csv'}", "line 2: field larger than field limit")


def test_a_line_without_end_is_refused_before_it_is_read_whole(tmp_path, monkeypatch):
    monkeypatch.setattr(local, "MAX_CSV_LINE", 1000)
    (tmp_path / "t.csv").write_bytes(b"\x00" * 5000)
    refused(f"csv:{tmp_path / 't.csv'}", "has a line longer than 1000 characters")


def test_a_spreadsheets_byte_order_mark_is_no_part_of_the_first_name(tmp_path):
    (tmp_path / "t.csv").write_text("\ufefflabel,a\n0,1\n1,2\n", encoding="utf-8")
    train, held_out = open_source(f"csv:{tmp_path / 't.csv'}?held_out=0").load()
    assert train.y.tolist() == [0, 1] and train.x.tolist() == [[1.0], [2.0]]


def test_a_repeated_column_is_refused(tmp_path):
    # With the label twice, the second copy would have trained as a feature.
    (tmp_path / "t.csv").write_text("label,a,label\n0,1,0\n1,2,1\n")
    refused(f"csv:{tmp_path / 't.csv'}", "names columns ['label'] more than once")


def test_a_label_too_large_for_an_integer_is_not_called_negative(tmp_path):
    (tmp_path / "t.csv").write_text("a,label\n1,1e20\n2,1\n")
    refused(f"csv:{tmp_path / 't.csv'}", "holds values that are not integers (or beyond ±2**53)")


def test_a_table_that_is_not_utf8_names_its_file(tmp_path):
    (tmp_path / "t.csv").write_bytes(b"a,label\n\xe9,0\n")
    refused(f"csv:{tmp_path / 't.csv'}", f"{tmp_path / 't.csv'} is not UTF-8 text")


# ---- image folder ----

def png_header_only(width: int, height: int) -> bytes:
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(b"")) + chunk(b"IEND", b""))


@pytest.mark.parametrize("side", [60_000, 12_000])  # beyond Pillow's error limit; between its warning and error
def test_an_image_of_too_many_pixels_is_refused_before_it_is_decoded(tmp_path, side):
    (tmp_path / "0").mkdir()
    (tmp_path / "0" / "a.png").write_bytes(png_header_only(side, side))
    with pytest.raises(DataSourceError, match=r"a\.png is not a readable image: .*pixels"):
        open_source(f"image-folder:{tmp_path}?shape=1x4x4").load()


def test_normalisation_that_makes_pixels_infinite_is_refused(tmp_path):
    (tmp_path / "0").mkdir()
    Image.new("L", (4, 4), 7).save(tmp_path / "0" / "a.png")
    refused(f"image-folder:{tmp_path}?shape=1x4x4&mean=1e39", "NaN or infinite")
    for option in ("mean=nan", "std=inf"):
        with pytest.raises(DataSourceError, match="finite number"):
            open_source(f"image-folder:{tmp_path}?shape=1x4x4&{option}")


def test_a_shape_of_billions_of_pixels_is_refused_in_the_spec(tmp_path):
    with pytest.raises(DataSourceError, match="images of at most"):
        open_source(f"image-folder:{tmp_path}?shape=1x100000x100000")


# ---- import ----

def test_a_loaders_dataset_failing_while_read_names_the_loader():
    refused("import:tests.shared.user_factories:device_broken_dataset",
            "'tests.shared.user_factories:device_broken_dataset': reading its samples raised RuntimeError: a "
            "transform failed")


# ---- partition ----

def test_a_partition_of_a_file_that_is_no_npz_is_a_data_source_error(tmp_path):
    (tmp_path / "not.npz").write_text("root:x:0:0\n")
    refused(f"partition:npz?clients=2&index=0&path={tmp_path / 'not.npz'}", "cannot read the partition data source")


def test_a_partition_of_a_loader_breaking_its_contract_is_a_data_source_error():
    refused("partition:tests.shared.user_factories:device_pair?clients=2&index=0",
            "cannot read the partition data source")
