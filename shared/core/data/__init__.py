"""Data: the run's federated data sets (`federated`, from `builtin` and `supplied` data sets, split by
`partition`), and a device's own data (`sources`: a DataSource named by a spec, its summary and whether it
fits a run). The names load on first use: a message carrying a DataSummary must not import torch."""
from __future__ import annotations

from typing import TYPE_CHECKING

from fl_services.shared.runtime.lazy import exports

_HOMES = {
    "ArrayDataset": "arrays",
    "ClientData": "arrays",
    "FederatedData": "federated",
    "few_shot_arrays": "federated",
    "load_client": "federated",
    "load_federated": "federated",
    "own_classes_test": "federated",
    "DataSource": "sources",
    "PartitionSource": "sources",
    "open_source": "sources",
    "DataSourceError": "specs",
    "SourceSpec": "specs",
    "parse_source": "specs",
    "DataSummary": "summary",
    "RunTask": "summary",
    "check_fits": "summary",
    "summarize": "summary",
}
__all__ = [
    "ArrayDataset",
    "check_fits",
    "ClientData",
    "DataSource",
    "DataSourceError",
    "DataSummary",
    "FederatedData",
    "few_shot_arrays",
    "load_client",
    "load_federated",
    "open_source",
    "own_classes_test",
    "parse_source",
    "PartitionSource",
    "RunTask",
    "SourceSpec",
    "summarize",
]

if TYPE_CHECKING:
    from fl_services.shared.core.data.arrays import ArrayDataset, ClientData
    from fl_services.shared.core.data.federated import (
        FederatedData,
        few_shot_arrays,
        load_client,
        load_federated,
        own_classes_test,
    )
    from fl_services.shared.core.data.sources import DataSource, PartitionSource, open_source
    from fl_services.shared.core.data.specs import DataSourceError, SourceSpec, parse_source
    from fl_services.shared.core.data.summary import DataSummary, RunTask, check_fits, summarize

__getattr__ = exports(__name__, _HOMES)
