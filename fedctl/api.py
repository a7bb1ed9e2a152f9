"""A small synchronous client of the cloud's control API (used by the CLI, the tests and bench/)."""
from __future__ import annotations

import ssl
import time
from collections.abc import Callable
from typing import TYPE_CHECKING
from urllib.parse import quote

import httpx

from fl_services.fedctl.errors import CloudError
from fl_services.shared.core.config import RunConfig
from fl_services.shared.core.reports import RoundRecord, RunStatus
from fl_services.shared.wire.admin import AuditRecord, Revocation, RevokedToken, RunInfo, RunSites, SiteInfo
from fl_services.shared.wire.http import env_proxy
from fl_services.shared.wire.retry import SyncRetryTransport
from fl_services.shared.wire.tls import client_context

if TYPE_CHECKING:
    from fl_services.shared.core.tensors import Tensors


def _detail(response: httpx.Response) -> str:
    """The cloud's `detail` as one line (a 422's list of errors joined), else the body's start."""
    try:
        detail = response.json().get("detail", response.text)
    except (ValueError, AttributeError):
        return " ".join(response.text[:500].split())
    if isinstance(detail, list):
        detail = "; ".join(f"{'.'.join(str(p) for p in d.get('loc', ()) if p != 'body')}: {d.get('msg')}"
                           if isinstance(d, dict) else str(d) for d in detail)
    return " ".join(str(detail)[:500].split())


def _run_path(run_id: str) -> str:
    # Quoted as one path segment, so that an id typed as "../../x" cannot reach another route (POST /api/x/start).
    return f"/api/v1/runs/{quote(run_id, safe='')}"


class CloudAPI:
    def __init__(self, base_url: str, admin_token: str, timeout: float = 60.0,
                 transport: httpx.BaseTransport | None = None, read_attempts: int = 5,
                 tls: ssl.SSLContext | None = None):
        # Reads are retried through a passing fault (a 5xx, a dropped connection: right after a Redis restart
        # one request in about ninety met a stale pooled connection); writes are not, since a create is not
        # idempotent. `transport` replaces the network under the retries (tests). `tls`: how an https://
        # cloud is verified and what certificate is presented (`shared.wire.tls.client_context`).
        network = transport or httpx.HTTPTransport(verify=tls or client_context(), proxy=env_proxy(base_url))
        retrying = SyncRetryTransport(network, attempts=read_attempts)
        self.http = httpx.Client(base_url=base_url, headers={"Authorization": f"Bearer {admin_token}"},
                                 timeout=timeout, transport=retrying)

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> "CloudAPI":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _ok(self, response: httpx.Response) -> httpx.Response:
        if response.status_code >= 400:
            raise CloudError(response.request.method, response.request.url.path, response.status_code,
                             _detail(response))
        return response

    def _get(self, path: str) -> httpx.Response:
        return self._ok(self.http.get(path))

    def create_run(self, config: RunConfig) -> RunInfo:
        response = self.http.post("/api/v1/runs", content=config.model_dump_json(),
                                  headers={"Content-Type": "application/json"})
        return RunInfo.model_validate_json(self._ok(response).content)

    def run(self, run_id: str) -> RunInfo:
        return RunInfo.model_validate_json(self._get(_run_path(run_id)).content)

    def runs(self) -> list[RunInfo]:
        return [RunInfo.model_validate(x) for x in self._get("/api/v1/runs").json()]

    def action(self, run_id: str, action: str) -> RunInfo:
        response = self.http.post(f"{_run_path(run_id)}/{quote(action, safe='')}")
        return RunInfo.model_validate_json(self._ok(response).content)

    def delete_run(self, run_id: str) -> None:
        self._ok(self.http.delete(_run_path(run_id)))

    def audit(self, limit: int = 100) -> list[AuditRecord]:
        return [AuditRecord.model_validate(x) for x in self._get(f"/api/v1/audit?limit={limit}").json()]

    def revoke_token(self, token_id: str) -> RevokedToken:
        response = self.http.post("/api/v1/tokens/revoked", content=Revocation(token_id=token_id).model_dump_json(),
                                  headers={"Content-Type": "application/json"})
        return RevokedToken.model_validate_json(self._ok(response).content)

    def sites(self) -> list[SiteInfo]:
        """The cloud's site registry."""
        return [SiteInfo.model_validate(x) for x in self._get("/api/v1/sites").json()]

    def run_sites(self, run_id: str) -> RunSites:
        """The sites a run uses, by name and edge id, with its round there."""
        return RunSites.model_validate_json(self._get(f"{_run_path(run_id)}/sites").content)

    def history(self, run_id: str) -> list[RoundRecord]:
        return [RoundRecord.model_validate(x) for x in self._get(f"{_run_path(run_id)}/history").json()]

    def model(self, run_id: str) -> Tensors:
        # torch is imported here alone: every other command of fedctl (and of this client) starts without it (~1 s).
        from fl_services.shared.core.tensors import decode_tensors

        return decode_tensors(self._get(f"{_run_path(run_id)}/model").content)

    def wait(self, run_id: str, timeout_s: float = 600.0, poll_s: float = 0.5,
             on_poll: Callable[[RunInfo], object] | None = None) -> RunInfo:
        """Polls until the run is finished or stopped; `on_poll(info)` sees every poll."""
        deadline = time.monotonic() + timeout_s
        while True:
            info = self.run(run_id)
            if on_poll:
                on_poll(info)
            if info.status in (RunStatus.finished, RunStatus.stopped):
                return info
            if time.monotonic() > deadline:
                raise TimeoutError(f"run {run_id} still {info.status.value} at version {info.version}")
            time.sleep(poll_s)
