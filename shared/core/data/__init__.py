"""Data: the run's federated data sets (`federated`, from `builtin` and `supplied` data sets, split by
`partition`), and a device's own data (`sources`: a DataSource named by a spec, its summary and whether it
fits a run)."""
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

__all__ = [
    "ArrayDataset",
    "ClientData",
    "DataSource",
    "DataSourceError",
    "DataSummary",
    "FederatedData",
    "PartitionSource",
    "RunTask",
    "SourceSpec",
    "check_fits",
    "few_shot_arrays",
    "load_client",
    "load_federated",
    "open_source",
    "own_classes_test",
    "parse_source",
    "summarize",
]
