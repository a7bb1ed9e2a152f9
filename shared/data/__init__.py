"""Datasets and their federated partitions; see `datasets` and `partition`."""
from shared.data.datasets import (
    ArrayDataset,
    ClientData,
    FederatedData,
    load_client,
    load_federated,
)

__all__ = ["ArrayDataset", "ClientData", "FederatedData", "load_client", "load_federated"]
