"""Datasets and their federated partitions; see `datasets` and `partition`."""
from fl_services.shared.core.data.datasets import (
    ArrayDataset,
    ClientData,
    FederatedData,
    load_client,
    load_federated,
)

__all__ = ["ArrayDataset", "ClientData", "FederatedData", "load_client", "load_federated"]
