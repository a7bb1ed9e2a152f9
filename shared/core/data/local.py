"""Readers of a device's own data, one per kind of spec (see `specs`): an npz file, a CSV table, a folder of
images per class, or the user's loader. Each reads once, checks what it read, and splits off its held-out part.
"""
from __future__ import annotations

import csv
import math
import os
import stat
import threading
import zipfile
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Generic, TextIO, TypeVar

import numpy as np
import torch

from fl_services.shared.core.data import tags
from fl_services.shared.core.data.arrays import (
    ArrayDataset,
    as_array,
    as_pair,
    check_samples,
    hold_out,
    to_dataset,
)
from fl_services.shared.core.data.specs import (
    DEFAULT_HELD_OUT,
    CsvSpec,
    DataSourceError,
    ImageFolderSpec,
    ImportSpec,
    NpzSpec,
)
from fl_services.shared.core.data.summary import DataSummary, shape_text, summarize
from fl_services.shared.core.user_code import call

Arrays = tuple[np.ndarray, np.ndarray]
S = TypeVar("S", NpzSpec, CsvSpec, ImageFolderSpec, ImportSpec)
_IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")
# A CSV row longer than this is not a table's row (a binary file named .csv, /dev/zero): reading it whole would
# take memory without end. 64 MiB holds a row of millions of features.
MAX_CSV_LINE = 64 * 2**20


def _regular_file(path: Path) -> None:
    """Refuses what is not a regular file before it is opened: a FIFO or a device would block or never end."""
    if not stat.S_ISREG(os.stat(path).st_mode):  # a missing file or a symlink loop: its OSError says so
        raise ValueError(f"{path} is not a regular file")


class OwnSource(ABC, Generic[S]):
    """A device's own data: read on the first `load` (once per process), then kept."""

    def __init__(self, spec: S):
        self.spec: S = spec
        self._lock = threading.Lock()
        self._loaded: tuple[ArrayDataset, ArrayDataset] | None = None
        self._summary: DataSummary | None = None

    def load(self) -> tuple[ArrayDataset, ArrayDataset]:
        with self._lock:
            if self._loaded is None:
                try:
                    train, held_out = self._read()
                    self._loaded = self._split(train, held_out)
                except (OSError, ValueError) as exc:  # a loader's UserCodeError too
                    raise DataSourceError(f"cannot read the {self.spec.kind} data source: {exc}") from exc
                except MemoryError:  # e.g. images resized to an enormous shape
                    raise DataSourceError(f"cannot read the {self.spec.kind} data source: it does not fit in this "
                                          "machine's memory") from None
            return self._loaded

    def summary(self) -> DataSummary:
        if self._summary is None:
            self._summary = summarize(*self.load())
        return self._summary

    @abstractmethod
    def _read(self) -> tuple[Arrays, Arrays | None]:
        """The samples, checked, and the held-out split the data names itself (None where it names none)."""

    def _split(self, train: Arrays, held_out: Arrays | None) -> tuple[ArrayDataset, ArrayDataset]:
        x, y = train
        if held_out is not None:
            if self.spec.held_out is not None:
                raise ValueError(f"held_out={self.spec.held_out} does not apply: the data names its own held-out "
                                 "split")
            if held_out[0].shape[1:] != x.shape[1:]:
                raise ValueError(f"held-out samples have shape {held_out[0].shape[1:]} but training samples "
                                 f"{x.shape[1:]}")
            return to_dataset(x, y), to_dataset(*held_out)
        share = DEFAULT_HELD_OUT if self.spec.held_out is None else self.spec.held_out
        rows, kept = hold_out(np.arange(len(y)), share, np.random.default_rng([self.spec.seed, tags.HELD_OUT]))
        return to_dataset(x[rows], y[rows]), to_dataset(x[kept], y[kept])


class NpzSource(OwnSource[NpzSpec]):
    """Arrays x (N, ...) and y (N,) integer labels; x_test and y_test, if present, are the held-out split."""

    def _read(self) -> tuple[Arrays, Arrays | None]:
        path = self.spec.path
        arrays = _npz_arrays(path)
        check_samples(arrays["x"], arrays["y"], f"{path}: x", f"{path}: y")
        if "x_test" not in arrays:
            return (arrays["x"], arrays["y"]), None
        check_samples(arrays["x_test"], arrays["y_test"], f"{path}: x_test", f"{path}: y_test")
        return (arrays["x"], arrays["y"]), (arrays["x_test"], arrays["y_test"])


def _npz_arrays(path: Path) -> dict[str, np.ndarray]:
    """The arrays x, y (and x_test, y_test) of an npz archive, each checked from its header before it is read:
    no array of Python objects is unpickled, and none claims more memory than the archive holds."""
    _regular_file(path)
    with open(path, "rb") as file:
        magic = file.read(len(np.lib.format.MAGIC_PREFIX))
    if magic == np.lib.format.MAGIC_PREFIX:
        raise ValueError(f"{path} is not an npz archive (np.savez) but one array (np.save)")
    try:
        with zipfile.ZipFile(path) as archive:
            names = {name.removesuffix(".npy") for name in archive.namelist() if name.endswith(".npy")}
            if not {"x", "y"} <= names or len(names & {"x_test", "y_test"}) == 1:
                raise ValueError(f"{path} must hold arrays x and y (and optionally both x_test and y_test); it has "
                                 f"{sorted(names)}")
            return {name: _npy_member(archive, name, path) for name in ("x", "y", "x_test", "y_test")
                    if name in names}
    except zipfile.BadZipFile as exc:
        raise ValueError(f"{path} is not an npz archive (np.savez): {exc}") from None


def _npy_member(archive: zipfile.ZipFile, name: str, path: Path) -> np.ndarray:
    info = archive.getinfo(f"{name}.npy")
    with archive.open(info) as member:
        try:
            version = np.lib.format.read_magic(member)
            if version == (1, 0):
                shape, fortran_order, dtype = np.lib.format.read_array_header_1_0(member)
            elif version == (2, 0):
                shape, fortran_order, dtype = np.lib.format.read_array_header_2_0(member)
            else:
                raise ValueError(f"npy format version {version[0]}.{version[1]} is not read")
        except ValueError as exc:
            raise ValueError(f"{path}: {name} is not a numpy array: {exc}") from None
        if dtype.hasobject:
            raise ValueError(f"{path}: {name} holds Python objects, which are never unpickled; save numeric arrays")
        size = int(np.prod(shape, dtype=object)) * dtype.itemsize
        held = info.file_size - member.tell()
        if size != held:
            raise ValueError(f"{path}: {name} declares shape {shape} of {dtype} ({size} bytes) but holds {held} bytes")
        try:
            data = member.read(size)
        except MemoryError:
            raise ValueError(f"{path}: {name} ({size} bytes) does not fit in this machine's memory") from None
    if len(data) != size:
        raise ValueError(f"{path}: {name} ends after {len(data)} of its {size} bytes")
    array = np.frombuffer(data, dtype=dtype)
    return array.reshape(shape[::-1]).transpose() if fortran_order else array.reshape(shape)


class CsvSource(OwnSource[CsvSpec]):
    """A table with a header row: the label column holds integer labels, every other column a feature."""

    def _read(self) -> tuple[Arrays, Arrays | None]:
        header, train = self._table(self.spec.path)
        if self.spec.test is None:
            return train, None
        test_header, test = self._table(self.spec.test)
        if test_header != header:
            raise ValueError(f"{self.spec.test} has columns {test_header} but {self.spec.path} has {header}")
        return train, test

    def _table(self, path: Path) -> tuple[list[str], Arrays]:
        _regular_file(path)
        # utf-8-sig: a spreadsheet's UTF-8 export starts with a byte-order mark, which is no part of a name.
        with open(path, newline="", encoding="utf-8-sig") as file:
            reader = csv.reader(_bounded_lines(file, path))
            try:
                header = [name.strip() for name in next(reader, [])]
                rows = [(line, row) for line, row in enumerate(reader, start=2) if any(cell.strip() for cell in row)]
            except csv.Error as exc:
                raise ValueError(f"{path} line {reader.line_num}: {exc}") from None
            except UnicodeDecodeError as exc:
                raise ValueError(f"{path} is not UTF-8 text: {exc}") from None
        if self.spec.label not in header:
            raise ValueError(f"{path} has no column {self.spec.label!r} (the label option); its columns: {header}")
        repeated = sorted({name for name in header if header.count(name) > 1})
        if repeated:  # a second label column would train as a feature
            raise ValueError(f"{path} names columns {repeated} more than once")
        if len(header) < 2:
            raise ValueError(f"{path} has no feature column besides the label {self.spec.label!r}")
        if not rows:
            raise ValueError(f"{path} has no rows")
        for line, row in rows:
            if len(row) != len(header):
                raise ValueError(f"{path} line {line} has {len(row)} cells for {len(header)} columns")
        try:
            table = np.array([row for _, row in rows], dtype=np.float64)
        except ValueError:
            raise ValueError(_first_non_number(path, header, rows)) from None
        column = header.index(self.spec.label)
        labels = table[:, column]
        # Beyond 2**53 a float64 is no longer an exact integer (and beyond 2**63 int64 would wrap it).
        if not np.all(np.isfinite(labels) & (labels == np.round(labels)) & (np.abs(labels) <= 2**53)):
            raise ValueError(f"{path}: the label column {self.spec.label!r} holds values that are not integers (or "
                             "beyond ±2**53)")
        x = np.delete(table, column, axis=1).astype(np.float32)
        if self.spec.shape is not None:
            if int(np.prod(self.spec.shape)) != x.shape[1]:
                raise ValueError(f"{path} has {x.shape[1]} feature columns, which do not make samples of shape "
                                 f"{shape_text(self.spec.shape)}")
            x = x.reshape(len(x), *self.spec.shape)
        y = labels.astype(np.int64)
        check_samples(x, y, f"{path}: the features", f"{path}: the labels")
        return header, (x, y)


def _bounded_lines(file: TextIO, path: Path) -> Iterator[str]:
    """The file's lines, each at most MAX_CSV_LINE characters long (one longer is refused, never read whole)."""
    while line := file.readline(MAX_CSV_LINE + 1):
        if len(line) > MAX_CSV_LINE:
            raise ValueError(f"{path} has a line longer than {MAX_CSV_LINE} characters: not a table")
        yield line


def _first_non_number(path: Path, header: list[str], rows: list[tuple[int, list[str]]]) -> str:
    for line, row in rows:
        for name, cell in zip(header, row, strict=True):
            try:
                float(cell)
            except ValueError:
                return f"{path} line {line}, column {name!r}: {cell!r} is not a number"
    return f"{path} holds cells that are not numbers"


class ImageFolderSource(OwnSource[ImageFolderSpec]):
    """One directory per class under the root, holding PNG or JPEG images, read (with Pillow) as grayscale
    (1 channel) or RGB (3) at the spec's shape.

    Labels: the `classes` option's order; else directory names that are all integers are the labels themselves
    (a device lacking class 3 still calls class 7 "7"); else the sorted names are numbered 0, 1, … — every
    device must then hold the same classes, so name them in `classes` where one may lack some."""

    def _read(self) -> tuple[Arrays, Arrays | None]:
        classes = _class_dirs(self.spec.path)
        if self.spec.classes is not None:
            labels = {name: label for label, name in enumerate(self.spec.classes)}
        elif classes and all(name.isdigit() for name in classes):
            labels = {name: int(name) for name in classes}
        else:
            labels = {name: label for label, name in enumerate(classes)}
        train = self._images(self.spec.path, labels)
        return train, None if self.spec.test is None else self._images(self.spec.test, labels)

    def _images(self, root: Path, labels: dict[str, int]) -> Arrays:
        from PIL import Image  # Pillow comes with matplotlib; imported only where images are read

        channels, height, width = self.spec.shape
        mode = "L" if channels == 1 else "RGB"
        samples: list[np.ndarray] = []
        targets: list[int] = []
        for name in _class_dirs(root):
            if name not in labels:
                raise ValueError(f"{root / name} is not one of the classes {sorted(labels)}")
            for file in sorted(p for p in (root / name).iterdir() if p.suffix.lower() in _IMAGE_SUFFIXES):
                try:
                    _regular_file(file)
                    with Image.open(file) as opened:
                        # Pillow only warns between MAX_IMAGE_PIXELS and twice that: decoding one takes
                        # gigabytes, for an image resized to a few thousand pixels.
                        if opened.width * opened.height > (Image.MAX_IMAGE_PIXELS or math.inf):
                            raise ValueError(f"{opened.width}x{opened.height} pixels, more than "
                                             f"{Image.MAX_IMAGE_PIXELS} (Pillow's limit)")
                        image = opened.convert(mode)
                except (OSError, ValueError, Image.DecompressionBombError) as exc:
                    raise ValueError(f"{file} is not a readable image: {exc}") from None
                if image.size != (width, height):
                    image = image.resize((width, height), Image.Resampling.BILINEAR)
                pixels = np.asarray(image, dtype=np.float32) / 255.0
                samples.append(pixels[None] if channels == 1 else pixels.transpose(2, 0, 1))
                targets.append(labels[name])
        if not samples:
            raise ValueError(f"{root} holds no PNG or JPEG images in class directories")
        with np.errstate(over="ignore"):  # an overflow becomes inf, which check_samples names
            x = ((np.stack(samples) - self.spec.mean) / self.spec.std).astype(np.float32)
        y = np.array(targets, dtype=np.int64)
        check_samples(x, y, f"{root}: the images (with mean and std)", f"{root}: the labels")
        return x, y


def _class_dirs(root: Path) -> list[str]:
    if not root.is_dir():
        raise ValueError(f"{root} is not a directory")
    return sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))


class ImportSource(OwnSource[ImportSpec]):
    """The user's loader, called once as `function(**args)`, returning either

    - a mapping with x and y (arrays or tensors; x of shape (N, ...), y integer labels), and optionally
      x_test and y_test, the held-out split;
    - (x, y), two arrays or tensors;
    - a torch Dataset of (x, y) samples, or a pair (train, held_out) of such Datasets or of (x, y) pairs."""

    def _read(self) -> tuple[Arrays, Arrays | None]:
        loaded = call(self.spec.loader, "data loader", **self.spec.args)
        try:
            train, held_out = _splits_of(loaded)
            check_samples(*train, "x", "y")
            if held_out is not None:
                check_samples(*held_out, "x_test", "y_test")
        except (ValueError, TypeError) as exc:
            raise ValueError(f"the data loader {self.spec.loader!r}: {exc}") from exc
        except Exception as exc:  # noqa: BLE001 - the loader's Dataset runs its own code while it is read
            raise ValueError(f"the data loader {self.spec.loader!r}: reading its samples raised "
                             f"{type(exc).__name__}: {exc}") from exc
        return train, held_out


def _splits_of(loaded: object) -> tuple[Arrays, Arrays | None]:
    if isinstance(loaded, Mapping):
        if not {"x", "y"} <= set(loaded) or len({"x_test", "y_test"} & set(loaded)) == 1:
            raise ValueError(f"its mapping must hold x and y (and optionally both x_test and y_test); it has "
                             f"{sorted(loaded)}")
        train = (as_array(loaded["x"], "x"), as_array(loaded["y"], "y"))
        if "x_test" not in loaded:
            return train, None
        return train, (as_array(loaded["x_test"], "x_test"), as_array(loaded["y_test"], "y_test"))
    if isinstance(loaded, torch.utils.data.Dataset):
        return as_pair(loaded, "train"), None
    if isinstance(loaded, (tuple, list)) and len(loaded) == 2:
        first, second = loaded
        if isinstance(first, (np.ndarray, torch.Tensor)) and isinstance(second, (np.ndarray, torch.Tensor)):
            return (as_array(first, "x"), as_array(second, "y")), None
        return as_pair(first, "train"), as_pair(second, "held-out")
    raise ValueError(f"it returned a {type(loaded).__name__}, not a mapping of arrays, an (x, y) pair, a torch "
                     "Dataset or a (train, held-out) pair")
