"""What crosses a process boundary: the messages by peer (JSON, or the header of a safetensors document),
the task and result bundles, the protocol's header names and device tokens, and the HTTP client with its retries and
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
    ResultBatchReceipt,
    ResultOutcome,
    ResultReceipt,
    TaskPoll,
)
from fl_services.shared.wire.edge_cloud import EdgeRegistration, GlobalStateHeader, RunEnd, SubmitReceipt
from fl_services.shared.wire.http import make_client
from fl_services.shared.wire.protocol import (
    RESULT_BUNDLE,
    SAFETENSORS,
    TASK_BUNDLE,
    device_token,
    issue_device_tokens,
)

__all__ = [
    "RESULT_BUNDLE", "SAFETENSORS", "TASK_BUNDLE", "AuditRecord", "ClientFailureReport", "ClientRegistration",
    "ClientResultHeader", "ClientTaskHeader", "CloudHealth", "EdgeHealth", "EdgeRegistration", "EdgeStatus",
    "GlobalStateHeader", "ResultBatchReceipt", "ResultOutcome", "ResultReceipt", "Revocation", "RevokedToken",
    "RunEdges", "RunEnd", "RunInfo", "RunUpdate", "SubmitReceipt", "TaskPoll", "device_token", "issue_device_tokens",
    "make_client",
]
