"""A device's own data sources: each kind read from files the test writes, their held-out splits, summaries,
spec errors, and whether data fits a run's task."""
from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from fl_services.shared.core.config import DataConfig
from fl_services.shared.core.data import (
    ArrayDataset,
    DataSourceError,
    DataSummary,
    PartitionSource,
    RunTask,
    check_fits,
    load_client,
    load_federated,
    open_source,
    parse_source,
    summarize,
)

LOADERS = "tests.shared.user_factories"


def write_npz(path: Path, samples: int = 50, **extra: np.ndarray) -> Path:
    x = np.arange(samples * 6, dtype=np.float32).reshape(samples, 2, 3)
    np.savez(path, x=x, y=np.arange(samples) % 4, **extra)
    return path


def first_values(ds: ArrayDataset) -> list[int]:
    """Each sample's first feature / 6: its row in the file."""
    return [int(v) for v in (ds.x.reshape(len(ds), -1)[:, 0] / 6).tolist()]


# ---- npz ----

def test_npz_holds_out_a_seeded_fifth_by_default(tmp_path):
    path = write_npz(tmp_path / "site.npz")
    train, held_out = open_source(f"npz:{path}").load()
    assert (len(train), len(held_out)) == (40, 10)
    assert train.x.shape == (40, 2, 3) and train.x.dtype == torch.float32 and train.y.dtype == torch.int64
    rows = first_values(train) + first_values(held_out)
    assert sorted(rows) == list(range(50))  # every row exactly once
    assert first_values(train) == sorted(first_values(train))  # the file's order kept
    np.testing.assert_array_equal(train.y.numpy(), np.array(first_values(train)) % 4)


def test_the_held_out_split_is_a_function_of_the_data_and_the_seed(tmp_path):
    path = write_npz(tmp_path / "site.npz")
    once = first_values(open_source(f"npz:{path}").load()[1])
    assert first_values(open_source(f"npz:{path}").load()[1]) == once  # another process, the same split
    assert first_values(open_source(f"npz:{path}?seed=0").load()[1]) == once  # seed 0 is the default
    other = first_values(open_source(f"npz:{path}?seed=7").load()[1])
    assert other != once and len(other) == 10
    assert first_values(open_source(f"npz:{path}?seed=7").load()[1]) == other


@pytest.mark.parametrize("held_out, sizes", [("0", (50, 0)), ("0.5", (25, 25)), ("0.01", (49, 1))])
def test_held_out_sets_the_share(tmp_path, held_out, sizes):
    train, test = open_source(f"npz:{write_npz(tmp_path / 'site.npz')}?held_out={held_out}").load()
    assert (len(train), len(test)) == sizes


def test_npz_with_its_own_test_arrays_uses_them(tmp_path):
    path = write_npz(tmp_path / "site.npz", x_test=-np.ones((7, 2, 3)), y_test=np.full(7, 2))
    train, held_out = open_source(f"npz:{path}").load()
    assert len(train) == 50 and first_values(train) == list(range(50))
    assert len(held_out) == 7 and bool((held_out.x == -1).all()) and held_out.y.tolist() == [2] * 7
    with pytest.raises(DataSourceError, match="held_out=0.3 does not apply: the data names its own held-out"):
        open_source(f"npz:{path}?held_out=0.3").load()


@pytest.mark.parametrize("arrays, fragment", [
    ({"x": np.zeros((4, 2))}, "must hold arrays x and y"),
    ({"x": np.zeros((4, 2)), "y": np.zeros(4, int), "x_test": np.zeros((1, 2))}, "both x_test and y_test"),
    ({"x": np.zeros((4, 2)), "y": np.zeros(3, int)}, "3 labels for 4 samples"),
    ({"x": np.full((4, 2), np.nan), "y": np.zeros(4, int)}, "NaN or infinite"),
    ({"x": np.zeros((4, 2)), "y": np.zeros(4)}, "must be a 1-D integer array"),
    ({"x": np.zeros((4, 2)), "y": -np.ones(4, int)}, "negative labels"),
    ({"x": np.zeros(4), "y": np.zeros(4, int)}, "must have shape (N, ...)"),
    ({"x": np.zeros((4, 2)), "y": np.zeros(4, int), "x_test": np.zeros((1, 3)), "y_test": np.zeros(1, int)},
     "held-out samples have shape (3,) but training samples (2,)"),
])
def test_a_malformed_npz_says_what_is_wrong(tmp_path, arrays, fragment):
    path = tmp_path / "bad.npz"
    np.savez(path, **arrays)
    with pytest.raises(DataSourceError, match="cannot read the npz data source") as raised:
        open_source(f"npz:{path}").load()
    assert fragment in str(raised.value)


def test_a_missing_file_and_a_single_array_are_refused(tmp_path):
    with pytest.raises(DataSourceError, match="No such file"):
        open_source(f"npz:{tmp_path / 'absent.npz'}").load()
    np.save(tmp_path / "one.npy", np.zeros(3))
    with pytest.raises(DataSourceError, match="is not an npz archive"):
        open_source(f"npz:{tmp_path / 'one.npy'}").load()


def test_a_source_reads_its_file_once(tmp_path):
    path = write_npz(tmp_path / "site.npz")
    source = open_source(f"npz:{path}")
    first = source.load()
    path.unlink()
    assert source.load() is first and source.summary().samples == 40


# ---- csv ----

def write_csv(path: Path, rows: list[list[object]], header: list[str]) -> Path:
    with open(path, "w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(header)
        writer.writerows(rows)
    return path


HEADER = ["f0", "f1", "target", "f2", "f3", "f4", "f5"]


def table(n: int, start: int = 0) -> list[list[object]]:
    """Row i: features 6i … 6i+5 around the label i % 3 (the third column)."""
    return [[6 * i, 6 * i + 1, i % 3, 6 * i + 2, 6 * i + 3, 6 * i + 4, 6 * i + 5] for i in range(start, start + n)]


def test_csv_label_column_and_shape(tmp_path):
    path = write_csv(tmp_path / "t.csv", table(20), HEADER)
    train, held_out = open_source(f"csv:{path}?label=target&shape=2x3&held_out=0.25").load()
    assert (len(train), len(held_out)) == (15, 5)
    assert train.x.shape == (15, 2, 3)
    rows = first_values(train)
    np.testing.assert_array_equal(train.x.numpy(), np.arange(120, dtype=np.float32).reshape(20, 2, 3)[rows])
    assert train.y.tolist() == [r % 3 for r in rows]


def test_csv_default_features_are_one_vector_and_test_is_its_own_table(tmp_path):
    path = write_csv(tmp_path / "t.csv", table(10), HEADER)
    test = write_csv(tmp_path / "t-test.csv", table(4, start=10), HEADER)
    train, held_out = open_source(f"csv:{path}?label=target&test={test}").load()
    assert train.x.shape == (10, 6) and held_out.x.shape == (4, 6)
    assert held_out.y.tolist() == [1, 2, 0, 1] and held_out.x[0].tolist() == [60, 61, 62, 63, 64, 65]


@pytest.mark.parametrize("rows, header, option, fragment", [
    (table(3), HEADER, "", "has no column 'label' (the label option)"),
    ([[1, 2, 0.5, 3, 4, 5, 6]], HEADER, "label=target", "label column 'target' holds values that are not integers"),
    ([[1, "x", 0, 3, 4, 5, 6]], HEADER, "label=target", "line 2, column 'f1': 'x' is not a number"),
    ([[1, 2, 0, 3]], HEADER, "label=target", "line 2 has 4 cells for 7 columns"),
    (table(3), HEADER, "label=target&shape=4x2", "6 feature columns, which do not make samples of shape 4x2"),
    ([], HEADER, "label=target", "has no rows"),
    ([[1], [2]], ["target"], "label=target", "no feature column besides the label"),
    ([[1, 2, -1, 3, 4, 5, 6]], HEADER, "label=target", "negative labels"),
])
def test_a_malformed_table_says_where(tmp_path, rows, header, option, fragment):
    path = write_csv(tmp_path / "t.csv", rows, header)
    with pytest.raises(DataSourceError, match="cannot read the csv data source") as raised:
        open_source(f"csv:{path}?{option}" if option else f"csv:{path}").load()
    assert fragment in str(raised.value)


def test_a_test_table_with_other_columns_is_refused(tmp_path):
    path = write_csv(tmp_path / "t.csv", table(5), HEADER)
    test = write_csv(tmp_path / "u.csv", [row[:6] for row in table(2)], HEADER[:6])
    with pytest.raises(DataSourceError, match="u.csv has columns"):
        open_source(f"csv:{path}?label=target&test={test}").load()


# ---- image folder ----

def write_images(root: Path, classes: dict[str, list[int]], size=(6, 4), mode="L", suffix=".png") -> Path:
    """One image per value under root/<class>/, every pixel that value (RGB: (v, v/2, 0))."""
    for name, values in classes.items():
        (root / name).mkdir(parents=True)
        for i, value in enumerate(values):
            color = value if mode == "L" else (value, value // 2, 0)
            Image.new(mode, size, color).save(root / name / f"{i:03d}{suffix}")
    return root


def test_integer_class_directories_are_the_labels(tmp_path):
    root = write_images(tmp_path / "imgs", {"0": [0, 51], "3": [102, 153, 204], "7": [255]})
    (root / "README.txt").write_text("not a class")
    (root / "3" / "notes.txt").write_text("not an image")
    train, held_out = open_source(f"image-folder:{root}?shape=1x4x6&held_out=0").load()
    assert len(held_out) == 0 and train.x.shape == (6, 1, 4, 6)
    assert train.y.tolist() == [0, 0, 3, 3, 3, 7]
    assert [round(float(v), 4) for v in train.x[:, 0, 0, 0]] == [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]
    assert bool((train.x == train.x[:, :, :1, :1]).all())  # each image uniform


def test_images_are_resized_converted_and_normalised(tmp_path):
    root = write_images(tmp_path / "imgs", {"cat": [255], "dog": [0, 255]}, size=(10, 10), mode="RGB",
                        suffix=".jpg")
    train, _ = open_source(f"image-folder:{root}?shape=3x5x5&held_out=0&mean=0.5&std=0.5").load()
    assert train.x.shape == (3, 3, 5, 5) and train.y.tolist() == [0, 1, 1]  # sorted names: cat 0, dog 1
    red = train.x[0, :, 2, 2]
    # (1 - .5) / .5 and (.5 - .5) / .5, within what JPEG keeps
    assert red[0] == pytest.approx(1.0, abs=0.02) and red[1] == pytest.approx(0.0, abs=0.03)
    gray, _ = open_source(f"image-folder:{root}?shape=1x8x8&held_out=0").load()
    assert gray.x.shape == (3, 1, 8, 8)


def test_classes_option_fixes_the_labels_and_test_folder_is_held_out(tmp_path):
    root = write_images(tmp_path / "train", {"dog": [10, 20]})
    test = write_images(tmp_path / "test", {"dog": [30], "bird": [40]})
    train, held_out = open_source(f"image-folder:{root}?shape=1x4x6&classes=cat,dog,bird&test={test}").load()
    assert train.y.tolist() == [1, 1] and held_out.y.tolist() == [2, 1]
    with pytest.raises(DataSourceError, match="bird is not one of the classes"):
        open_source(f"image-folder:{root}?shape=1x4x6&test={test}").load()


@pytest.mark.parametrize("setup, fragment", [
    (lambda root: root.mkdir(), "holds no PNG or JPEG images in class directories"),
    (lambda root: None, "is not a directory"),
    (lambda root: ((root / "0").mkdir(parents=True), (root / "0" / "a.png").write_bytes(b"not a png")),
     "a.png is not a readable image"),
    (lambda root: write_images(root, {"0": [1]}) and (root / "ghost").mkdir(), None),
])
def test_an_unreadable_folder_says_why(tmp_path, setup, fragment):
    root = tmp_path / "imgs"
    setup(root)
    source = open_source(f"image-folder:{root}?shape=1x4x6")
    if fragment is None:  # an empty class directory is a class this device lacks
        assert source.summary().samples == 1
        return
    with pytest.raises(DataSourceError, match="cannot read the image-folder data source") as raised:
        source.load()
    assert fragment in str(raised.value)


# ---- import ----

def test_an_imported_loader_gets_its_arguments_as_json_values():
    train, held_out = open_source(f"import:{LOADERS}:device_data?samples=20&held_out=0.5").load()
    assert (len(train), len(held_out)) == (10, 10) and train.x.shape == (10, 2, 3)
    train, held_out = open_source(f"import:{LOADERS}:device_data?samples=20&test_samples=3").load()
    assert (len(train), len(held_out)) == (20, 3) and held_out.y.tolist() == [0, 0, 0]


def test_an_imported_loaders_test_arrays_are_its_held_out_split():
    train, held_out = open_source(parse_source(f"import:{LOADERS}:device_data?samples=12")).load()
    assert (len(train), len(held_out)) == (10, 2)  # no x_test: the default fifth
    source = open_source(f"import:{LOADERS}:device_pair")
    assert source.summary().samples == 24 and source.summary().held_out_samples == 6


def test_an_imported_loaders_datasets_are_read_into_arrays():
    train, held_out = open_source(f"import:{LOADERS}:device_datasets").load()
    assert (len(train), len(held_out)) == (40, 10) and bool((held_out.x == -1).all())


@pytest.mark.parametrize("loader, fragment", [
    ("device_strings", "x must be numeric, got dtype <U1"),
    ("wrong_type", "it returned a list"),
    ("missing_key", "must hold x and y"),
    ("exiting_loader", "raised SystemExit"),
    ("absent", "has no function 'absent'"),
])
def test_an_imported_loader_that_breaks_the_contract_is_named(loader, fragment):
    with pytest.raises(DataSourceError, match=f"{LOADERS}:{loader}") as raised:
        open_source(f"import:{LOADERS}:{loader}").load()
    assert fragment in str(raised.value)


# ---- partition ----

def test_a_partition_source_is_the_runs_client_and_shares_the_cache():
    spec = "partition:digits?clients=5&index=3&partitioner=dirichlet&alpha=0.3&seed=2&held_out=0.1"
    source = open_source(spec)
    cfg = DataConfig(dataset="digits", num_clients=5, partition="dirichlet", alpha=0.3, client_holdout=0.1)
    client = load_client(cfg, 2, 3)
    train, held_out = source.load()
    assert train is client.train and held_out is client.test  # no copy: 1,000 clients share one partition
    again = PartitionSource.of_run(cfg, 2, 4).load()[0]
    assert again is load_federated(cfg, 2).clients[4].train
    assert source.summary() == summarize(client.train, client.test)


# ---- summary and fit ----

def dataset(x_shape: tuple[int, ...], labels: list[int]) -> ArrayDataset:
    return ArrayDataset(torch.zeros((len(labels), *x_shape)), torch.tensor(labels, dtype=torch.int64))


def test_summary_counts_samples_labels_and_the_histogram():
    summary = summarize(dataset((1, 4, 4), [2, 0, 2, 2, 5]), dataset((1, 4, 4), [7, 0]))
    assert summary == DataSummary(samples=5, held_out_samples=2, input_shape=(1, 4, 4), labels=(0, 2, 5, 7),
                                  histogram={0: 1, 2: 3, 5: 1})
    assert DataSummary.model_validate_json(summary.model_dump_json()) == summary  # travels as JSON


def test_an_npz_summary_is_computed_from_its_splits(tmp_path):
    path = write_npz(tmp_path / "site.npz", samples=10, x_test=np.zeros((3, 2, 3)), y_test=np.array([9, 9, 1]))
    summary = open_source(f"npz:{path}").summary()
    assert summary == DataSummary(samples=10, held_out_samples=3, input_shape=(2, 3), labels=(0, 1, 2, 3, 9),
                                  histogram={0: 3, 1: 3, 2: 2, 3: 2})


def test_data_that_fits_has_no_reasons():
    summary = summarize(dataset((1, 8, 8), [0, 9, 3]), dataset((1, 8, 8), [1]))
    assert check_fits(summary, RunTask(input_shape=(1, 8, 8), num_classes=10)) == []


def test_check_fits_says_every_reason():
    summary = summarize(dataset((3, 2), [0, 4, 12, 11, 10, 9, 8]), dataset((3, 2), [13]))
    assert check_fits(summary, RunTask(input_shape=(2, 3), num_classes=8)) == [
        "its samples have shape 3x2 but the run's model takes 2x3",
        "its labels 8, 9, 10, 11, 12, … lie outside the run's 8 classes (0 … 7)",
    ]
    empty = summarize(dataset((2, 3), []), dataset((2, 3), []))
    assert check_fits(empty, RunTask(input_shape=(2, 3), num_classes=8)) == ["it holds no training samples"]


def test_check_fits_names_a_held_out_label_outside_the_classes():
    summary = summarize(dataset((4,), [0, 1]), dataset((4,), [2]))
    assert check_fits(summary, RunTask(input_shape=(4,), num_classes=2)) == [
        "its labels 2 lie outside the run's 2 classes (0 … 1)"]


# ---- specs ----

def test_specs_parse_into_typed_configs(tmp_path):
    spec = parse_source("csv:/data/t.csv?label=target&held_out=0.2")
    assert (spec.kind, str(spec.path), spec.label, spec.held_out, spec.seed) == ("csv", "/data/t.csv", "target", 0.2, 0)
    spec = parse_source("image-folder:/data/imgs?shape=1x28x28&classes=a,b")
    assert (spec.shape, spec.classes, spec.test) == ((1, 28, 28), ("a", "b"), None)
    spec = parse_source("partition:mnist5k?clients=10&index=3&partitioner=iid")
    assert (spec.index, spec.seed, spec.data) == (3, 0, DataConfig(dataset="mnist5k", num_clients=10))
    spec = parse_source("import:pkg.mod:load?size=5&name=abc&flags=[1,2]&on=true&seed=4")
    assert (spec.loader, spec.args, spec.seed) == ("pkg.mod:load", {"size": 5, "name": "abc", "flags": [1, 2],
                                                                     "on": True}, 4)
    assert parse_source("npz:~/site.npz").path == Path.home() / "site.npz"


@pytest.mark.parametrize("spec, fragment", [
    ("npz", "write KIND:LOCATION[?key=value&…]"),
    ("npz:", "write KIND:LOCATION"),
    ("hdf5:/x.h5", "unknown kind 'hdf5'; known: partition, npz, csv, image-folder, import"),
    ("parquet:/t.parquet", "Parquet needs pyarrow"),
    ("csv:/t.csv?lable=y", "unknown option 'lable' for csv (known: held_out, seed, label, test, shape)"),
    ("csv:/t.csv?label=a&label=b", "option 'label' is given twice"),
    ("csv:/t.csv?label", "options must be key=value"),
    ("csv:/t.csv?held_out=1.5", "held_out: Input should be less than 1"),
    ("csv:/t.csv?held_out=half", "held_out: Input should be a valid number"),
    ("csv:/t.csv?held_out=0.2&test=/u.csv", "give test (a held-out split of its own) or held_out"),
    ("npz:/x.npz?seed=-1", "seed: Input should be greater than or equal to 0"),
    ("image-folder:/imgs", "shape: Field required"),
    ("image-folder:/imgs?shape=2x4x4", "shape 2x4x4: images have 1 (grayscale) or 3 (RGB) channels"),
    ("image-folder:/imgs?shape=1x0x4", "shape '1x0x4' must be positive sizes joined by 'x'"),
    ("image-folder:/imgs?shape=28x28", "shape '28x28' must be channels x height x width"),
    ("partition:mnist5k?clients=10&index=10", "index 10 is not among the 10 clients (0 … 9)"),
    ("partition:mnist5k?clients=0&index=0", "clients: Input should be greater than or equal to 1"),
    ("partition:mnist5k?index=0&partitioner=spread", "partitioner: Input should be 'iid'"),
    ("partition:mnist5k", "index: Field required"),
    ("partition:cifar?index=0", "dataset: data.dataset must be one of"),
    ("partition:mnist5k?index=0&label=y", "unknown option 'label' for partition"),
    ("import:loader?x=1", "loader must be an import path 'package.module:function'"),
])
def test_a_bad_spec_names_the_problem(spec, fragment):
    with pytest.raises(DataSourceError) as raised:
        parse_source(spec)
    assert str(raised.value).startswith(f"data source {spec!r}: ")
    assert fragment in str(raised.value)
