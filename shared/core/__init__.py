"""Federated learning without a network: algorithms, models, data, local training, the edge and cloud rounds
and the in-process reference runner that the services must equal. Imports neither HTTP nor Redis.

The names below load on first use (torch and the data sets are heavy; a command's --help should not wait)."""
from __future__ import annotations

from typing import TYPE_CHECKING

from fl_services.shared.runtime.lazy import exports

_HOMES = {
    "RunConfig": "config", "DataConfig": "config", "ModelConfig": "config", "LocalTrainingConfig": "config",
    "Algorithm": "algorithms.base", "ClientResult": "algorithms.base", "Contribution": "algorithms.base",
    "EdgeAggregate": "algorithms.base", "LocalJob": "algorithms.base",
    "available": "algorithms.registry", "create": "algorithms.registry", "parse_config": "algorithms.registry",
    "build_model": "models", "Tensors": "tensors", "Record": "records",
    "RoundRecord": "reports", "ClientParticipation": "reports", "EdgeContributionHeader": "reports",
    "run_edge_round": "edge_round", "run_cloud_round": "cloud_round", "select_clients": "selection",
    "run_reference": "reference", "ReferenceResult": "reference",
}
__all__ = [
    "Algorithm", "ClientParticipation", "ClientResult", "Contribution", "DataConfig", "EdgeAggregate",
    "EdgeContributionHeader", "LocalJob", "LocalTrainingConfig", "ModelConfig", "Record", "ReferenceResult",
    "RoundRecord", "RunConfig", "Tensors", "available", "build_model", "create", "parse_config", "run_cloud_round",
    "run_edge_round", "run_reference", "select_clients",
]  # what _HOMES places

if TYPE_CHECKING:
    from fl_services.shared.core.algorithms.base import Algorithm, ClientResult, Contribution, EdgeAggregate, LocalJob
    from fl_services.shared.core.algorithms.registry import available, create, parse_config
    from fl_services.shared.core.cloud_round import run_cloud_round
    from fl_services.shared.core.config import DataConfig, LocalTrainingConfig, ModelConfig, RunConfig
    from fl_services.shared.core.edge_round import run_edge_round
    from fl_services.shared.core.models import build_model
    from fl_services.shared.core.records import Record
    from fl_services.shared.core.reference import ReferenceResult, run_reference
    from fl_services.shared.core.reports import ClientParticipation, EdgeContributionHeader, RoundRecord
    from fl_services.shared.core.selection import select_clients
    from fl_services.shared.core.tensors import Tensors


__getattr__ = exports(__name__, _HOMES)
