"""What crosses a process boundary: the messages by peer (JSON, or the header of a safetensors document),
the task bundle, the protocol's header names and device tokens, and the HTTP client with its retries and
TLS. Imports core only (whose reports the messages carry)."""
from __future__ import annotations

from fl_services.shared.wire.admin import (
    AuditRecord,
    CloudHealth,
    EdgeHealth,
    EdgeStatus,
    Revocation,
    RevokedToken,
    RunEdges,
    RunInfo,
    RunUpdate,
)
from fl_services.shared.wire.client_edge import (
    ClientFailureReport,
    ClientRegistration,
    ClientResultHeader,
    ClientTaskHeader,
    ResultReceipt,
    TaskPoll,
)
from fl_services.shared.wire.edge_cloud import EdgeRegistration, GlobalStateHeader, RunEnd, SubmitReceipt
from fl_services.shared.wire.http import make_client
from fl_services.shared.wire.protocol import SAFETENSORS, TASK_BUNDLE, device_token, issue_device_tokens

__all__ = [
    "AuditRecord", "ClientFailureReport", "ClientRegistration", "ClientResultHeader", "ClientTaskHeader",
    "CloudHealth", "EdgeHealth", "EdgeRegistration", "EdgeStatus", "GlobalStateHeader", "ResultReceipt",
    "Revocation", "RevokedToken", "RunEdges", "RunEnd", "RunInfo", "RunUpdate", "SAFETENSORS", "SubmitReceipt",
    "TASK_BUNDLE", "TaskPoll", "device_token", "issue_device_tokens", "make_client",
]
