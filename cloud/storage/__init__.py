"""The cloud's storage, behind a port: what the routes, the orchestrator and the background tasks may ask of it
(ports.py), kept by a backend that implements it. Two do: `MemoryStore` (this process's memory: tests and a
single-process development cloud) and `fl_services.cloud.storage.redis.RedisStore` (Redis, shared by every
replica; imported from there, so that nothing but the cloud's entry point loads redis-py).

Implementing another backend: docs/how-to-storage-backend.md.
"""
from __future__ import annotations

from fl_services.cloud.storage.memory import MemoryStore
from fl_services.cloud.storage.ports import (
    ACTIVE,
    ENDED,
    TRANSITIONS,
    UPDATABLE,
    Action,
    AuditLog,
    BufferedContribution,
    Conflict,
    ContributionBuffer,
    EdgeRegistry,
    Events,
    Lease,
    LeaseLost,
    MembersElsewhere,
    NotFound,
    RevokedTokens,
    Runs,
    SiteRegistry,
    StateTooLarge,
    StorageError,
    StorageRefused,
    StorageUnavailable,
    Store,
    SubmitOutcome,
    UpdateLeases,
    now,
)

__all__ = [
    "ACTIVE", "ENDED", "TRANSITIONS", "UPDATABLE", "Action", "AuditLog", "BufferedContribution", "Conflict",
    "ContributionBuffer", "EdgeRegistry", "Events", "Lease", "LeaseLost", "MembersElsewhere", "MemoryStore",
    "NotFound", "RevokedTokens",
    "Runs", "SiteRegistry", "StateTooLarge", "StorageError", "StorageRefused", "StorageUnavailable", "Store",
    "SubmitOutcome", "UpdateLeases", "now",
]
