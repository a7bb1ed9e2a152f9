"""What a device names as its data: a typed spec, written on the command line as `KIND:LOCATION?key=value&…`.

    partition:mnist5k?clients=10&index=3&partitioner=iid    partition 3 of a run-like split (simulation)
    npz:/data/site.npz                                      arrays x, y (optionally x_test, y_test)
    csv:/data/t.csv?label=target&held_out=0.2               a table with a header row and a label column
    image-folder:/data/imgs?shape=1x28x28                   one directory of PNG/JPEG images per class
    import:my_pkg.data:load?size=500                        the user's loader, called as load(size=500)

Every source holds out part of its data for evaluation on the device. The data's own split is used where it
names one (an npz's x_test/y_test, a table's or folder's `test=PATH`, a loader's x_test/y_test); otherwise
`held_out` (default 0.2) of the samples is drawn at random, seeded by `seed` (default 0): the same data and
spec always give the same split. `held_out=0` trains on every sample. A partition's held-out split is the
client's own (`held_out` sets the run's client_holdout). An `import:` spec's other options are the loader's
keyword arguments, each read as JSON where it parses (5, 0.1, true, [1, 2]) and as text otherwise.

Parquet is not read: it needs pyarrow, which the device install does not carry. Convert the table to CSV, or
read it in a loader of your own (`import:`).
"""
from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Annotated, Any, Callable, Literal, Union
from urllib.parse import parse_qsl

from pydantic import BaseModel, ConfigDict, Field, JsonValue, TypeAdapter, ValidationError, model_validator

from fl_services.shared.core.config import DataConfig, is_import_path
from fl_services.shared.core.data.summary import shape_text

DEFAULT_HELD_OUT = 0.2
# The largest height x width an image source resizes to (4096 x 4096): far beyond what a device trains on.
MAX_IMAGE_PIXELS = 2**24


class DataSourceError(ValueError):
    """A data source that cannot be named or read as given; the message says why."""


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class _OwnData(_Spec):
    """A device's own data, with the held-out split drawn where the data names none."""

    held_out: float | None = Field(None, ge=0, lt=1, description="share held out where the data names no held-out "
                                   f"split of its own (default {DEFAULT_HELD_OUT}); 0: every sample trains")
    seed: int = Field(0, ge=0, lt=2**63, description="seed of that draw")


class PartitionSpec(_Spec):
    """Client `index` of a run's partition of a data set: exactly what a simulated client trains on."""

    kind: Literal["partition"] = "partition"
    data: DataConfig
    seed: int = Field(0, ge=0, lt=2**31, description="the run seed")
    index: int = Field(ge=0)

    @model_validator(mode="after")
    def _index_in_range(self) -> PartitionSpec:
        if self.index >= self.data.num_clients:
            raise ValueError(f"index {self.index} is not among the {self.data.num_clients} clients (0 … "
                             f"{self.data.num_clients - 1})")
        return self


class NpzSpec(_OwnData):
    kind: Literal["npz"] = "npz"
    path: Path


class _WithTest(_OwnData):
    """Data whose held-out split may lie beside it (`test`), in the same form."""

    test: Path | None = Field(None, description="the held-out split, in the same form (a table with the same "
                              "columns, a folder laid out alike)")

    @model_validator(mode="after")
    def _one_held_out(self) -> _WithTest:
        if self.test is not None and self.held_out is not None:
            raise ValueError("give test (a held-out split of its own) or held_out (a share drawn from the data), "
                             "not both")
        return self


class CsvSpec(_WithTest):
    kind: Literal["csv"] = "csv"
    path: Path
    label: str = Field("label", min_length=1, description="the label column; every other column is a feature")
    shape: tuple[int, ...] | None = Field(None, description="each row's features reshaped (default: one vector)")


class ImageFolderSpec(_WithTest):
    kind: Literal["image-folder"] = "image-folder"
    path: Path
    shape: tuple[int, int, int] = Field(description="channels x height x width: 1 reads grayscale, 3 RGB; "
                                        "images of another size are resized")
    classes: tuple[str, ...] | None = Field(None, min_length=1, description="the class directories in label "
                                            "order (default: integer names are the labels, else sorted names)")
    mean: float = Field(0.0, allow_inf_nan=False, description="pixels in [0, 1] become (pixel - mean) / std")
    std: float = Field(1.0, gt=0, allow_inf_nan=False)

    @model_validator(mode="after")
    def _channels(self) -> ImageFolderSpec:
        if self.shape[0] not in (1, 3):
            raise ValueError(f"shape {shape_text(self.shape)}: images have 1 (grayscale) or 3 (RGB) channels")
        if self.shape[1] * self.shape[2] > MAX_IMAGE_PIXELS:
            # Every image is resized to it: one of billions of pixels would take the machine's memory.
            raise ValueError(f"shape {shape_text(self.shape)}: images of at most {MAX_IMAGE_PIXELS} pixels")
        return self


class ImportSpec(_OwnData):
    kind: Literal["import"] = "import"
    loader: str = Field(description="'package.module:function', called as function(**args)")
    args: dict[str, JsonValue] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _import_path(self) -> ImportSpec:
        if not is_import_path(self.loader):
            raise ValueError(f"loader must be an import path 'package.module:function', got {self.loader!r}")
        return self


SourceSpec = Annotated[Union[PartitionSpec, NpzSpec, CsvSpec, ImageFolderSpec, ImportSpec], Field(discriminator="kind")]
_SPEC: TypeAdapter[SourceSpec] = TypeAdapter(SourceSpec)


def _shape(text: str) -> tuple[int, ...]:
    try:
        shape = tuple(int(d) for d in text.lower().split("x"))
    except ValueError:
        shape = ()
    if not shape or min(shape) < 1:
        raise DataSourceError(f"shape {text!r} must be positive sizes joined by 'x', e.g. 1x28x28")
    return shape


def _image_shape(text: str) -> tuple[int, ...]:
    shape = _shape(text)
    if len(shape) != 3:
        raise DataSourceError(f"shape {text!r} must be channels x height x width, e.g. 1x28x28")
    return shape


def _path(text: str) -> Path:
    return Path(text).expanduser()


def _names(text: str) -> tuple[str, ...]:
    return tuple(name.strip() for name in text.split(",") if name.strip())


def _json_or_text(text: str) -> JsonValue:
    """A loader's argument as written: a JSON value (5, 0.1, true, [1, 2]) or else the text itself."""
    try:
        value: JsonValue = json.loads(text)
    except ValueError:
        return text
    return value


# Each kind's options as written in a spec (each sets the field of its name) and how its text is read (as
# is: pydantic reads numbers from text).
_Read = Callable[[str], Any]
_OWN: dict[str, _Read] = {"held_out": str, "seed": str}
_OPTIONS: dict[str, dict[str, _Read]] = {
    "npz": _OWN,
    "csv": {**_OWN, "label": str, "test": _path, "shape": _shape},
    "image-folder": {**_OWN, "shape": _image_shape, "test": _path, "classes": _names, "mean": str, "std": str},
    "import": _OWN,
}
# A partition's options name DataConfig's fields (but index and seed, the spec's own).
_PARTITION: dict[str, str] = {
    "clients": "num_clients", "partitioner": "partition", "alpha": "alpha", "shards": "shards_per_client",
    "held_out": "client_holdout", "test_fraction": "test_fraction", "path": "path",
    "synthetic_alpha": "synthetic_alpha", "synthetic_beta": "synthetic_beta",
}
KINDS = ("partition", "npz", "csv", "image-folder", "import")


def parse_source(text: str) -> SourceSpec:
    """The typed spec a `KIND:LOCATION?key=value&…` string names; a DataSourceError says what is wrong."""
    kind, colon, rest = text.partition(":")
    location, _, query = rest.partition("?")
    if not colon or not location:
        raise DataSourceError(f"data source {text!r}: write KIND:LOCATION[?key=value&…] with KIND one of "
                              f"{', '.join(KINDS)}, e.g. npz:/data/site.npz")
    if kind == "parquet":
        raise DataSourceError(f"data source {text!r}: Parquet needs pyarrow, which this install does not include; "
                              "write the table as CSV (csv:PATH?label=COLUMN) or read it with your own loader "
                              "(import:package.module:function)")
    if kind not in KINDS:
        raise DataSourceError(f"data source {text!r}: unknown kind {kind!r}; known: {', '.join(KINDS)}")
    try:
        pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query))
    except ValueError as exc:
        raise DataSourceError(f"data source {text!r}: options must be key=value joined by '&': {exc}") from None
    options: dict[str, str] = {}
    for key, value in pairs:
        if key in options:
            raise DataSourceError(f"data source {text!r}: option {key!r} is given twice")
        options[key] = value
    try:
        fields, names = _fields(kind, location, options)
        return _SPEC.validate_python(fields)
    except DataSourceError as exc:
        raise DataSourceError(f"data source {text!r}: {exc}") from None
    except ValidationError as exc:
        problems = "; ".join(_problem(error["loc"], error["msg"], names) for error in exc.errors())
        raise DataSourceError(f"data source {text!r}: {problems}") from None


def _fields(kind: str, location: str, options: dict[str, str]) -> tuple[dict[str, Any], dict[str, str]]:
    """The spec's fields, and the option each field came from (to name it in an error)."""
    if kind == "partition":
        fields: dict[str, Any] = {"kind": kind}
        data: dict[str, Any] = {"dataset": location}
        for key, value in options.items():
            if key in ("index", "seed"):
                fields[key] = value
            elif key in _PARTITION:
                data[_PARTITION[key]] = _config_value(_PARTITION[key], value)
            else:
                raise DataSourceError(_unknown(key, kind, ["index", "seed", *_PARTITION]))
        fields["data"] = data
        return fields, {f"data.{field}": key for key, field in _PARTITION.items()}
    known = _OPTIONS[kind]
    if kind == "import":
        own = {key: value for key, value in options.items() if key in known}
        args = {key: _json_or_text(value) for key, value in options.items() if key not in known}
        return {"kind": kind, "loader": location, "args": args, **own}, {}
    fields = {"kind": kind, "path": _path(location)}
    for key, value in options.items():
        if key not in known:
            raise DataSourceError(_unknown(key, kind, list(known)))
        fields[key] = known[key](value)
    return fields, {}


def _config_value(field: str, text: str) -> Any:
    """An option's text as DataConfig's `field` takes it: its integers and numbers are JSON's, not text
    (shared/core/numbers.py); text that is no such number stays text, for the field to refuse by name."""
    number = DataConfig.model_fields[field].annotation
    if number in (int, float):
        with contextlib.suppress(ValueError):
            return number(text)
    return text


def _unknown(key: str, kind: str, known: list[str]) -> str:
    return f"unknown option {key!r} for {kind} (known: {', '.join(known)})"


def _problem(loc: tuple[int | str, ...], message: str, names: dict[str, str]) -> str:
    """A validation error as the spec's writer sees it: the option it concerns (none for the spec as a whole)."""
    # The union's tag leads each location (('csv', 'held_out')); a partition's DataConfig sits under 'data'.
    path = ".".join(str(part) for part in loc[1:])
    option = names.get(path, path.removeprefix("data").lstrip("."))
    message = message.removeprefix("Value error, ")
    return f"{option}: {message}" if option else message
