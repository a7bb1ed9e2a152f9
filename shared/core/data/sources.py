"""A device's data, named by the device: a `DataSource` yields its training and held-out splits and a summary
computed locally. A spec (`specs`) names one; `open_source` opens it.

The `partition` source is a client of a run's partition (data set + partitioner + index), exactly what a
simulated client trains on: it is how the simulation workers, benchmarks and tests name their data. It reads
through load_federated's cache, so a process hosting 1,000 simulated clients builds the partition once.
"""
from __future__ import annotations

from typing import Protocol

from fl_services.shared.core.config import DataConfig
from fl_services.shared.core.data.arrays import ArrayDataset, ClientData
from fl_services.shared.core.data.federated import load_client
from fl_services.shared.core.data.local import CsvSource, ImageFolderSource, ImportSource, NpzSource
from fl_services.shared.core.data.specs import (
    CsvSpec,
    DataSourceError,
    ImageFolderSpec,
    NpzSpec,
    PartitionSpec,
    SourceSpec,
    parse_source,
)
from fl_services.shared.core.data.summary import DataSummary, summarize


class DataSource(Protocol):
    def load(self) -> tuple[ArrayDataset, ArrayDataset]:
        """(train, held_out): the samples to train on and those kept for evaluation on the device."""
        ...

    def summary(self) -> DataSummary:
        ...


class PartitionSource:
    """Client `index` of a run's partition, with its own held-out split (the run's client_holdout)."""

    def __init__(self, spec: PartitionSpec):
        self.spec = spec

    @classmethod
    def of_run(cls, data: DataConfig, seed: int, index: int) -> PartitionSource:
        return cls(PartitionSpec(data=data, seed=seed, index=index))

    def client_data(self) -> ClientData:
        try:
            return load_client(self.spec.data, self.spec.seed, self.spec.index)
        except (OSError, ValueError) as exc:  # an npz that is none, an imported loader's UserCodeError
            raise DataSourceError(f"cannot read the partition data source: {exc}") from exc

    def load(self) -> tuple[ArrayDataset, ArrayDataset]:
        client = self.client_data()
        return client.train, client.test

    def summary(self) -> DataSummary:
        return summarize(*self.load())


def open_source(spec: str | SourceSpec) -> DataSource:
    """The source a spec names (a `KIND:LOCATION?…` string is parsed first); nothing is read until `load`."""
    if isinstance(spec, str):
        spec = parse_source(spec)
    if isinstance(spec, PartitionSpec):
        return PartitionSource(spec)
    if isinstance(spec, NpzSpec):
        return NpzSource(spec)
    if isinstance(spec, CsvSpec):
        return CsvSource(spec)
    if isinstance(spec, ImageFolderSpec):
        return ImageFolderSource(spec)
    return ImportSource(spec)
