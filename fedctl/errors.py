"""What fedctl says when a command fails: one line, naming what to change (a variable, a file and line)."""
from __future__ import annotations

import ssl

import httpx

from fl_services.shared.runtime.extras import MissingExtra


class CloudError(RuntimeError):
    """An error answer of the cloud: what was asked, the status and the cloud's detail."""

    def __init__(self, method: str, path: str, status: int, detail: str):
        super().__init__(f"{method} {path}: {status} {detail}")
        self.method, self.path, self.status, self.detail = method, path, status, detail

TOKEN_HINT = ("set FL_ADMIN_TOKEN (or --token) to an admin token of the cloud (its FL_CLOUD_ADMIN_TOKEN or one of "
              "FL_CLOUD_ADMIN_TOKENS; `fedctl up` prints its own)")
CLOUD_HINT = "is it up? set FL_CLOUD_URL (or --cloud) to its address; `fedctl up` starts one on this machine"


def is_operator_error(exc: BaseException) -> bool:
    """A mistake or an unreachable peer, said in one line; anything else is a defect, shown with its traceback."""
    return isinstance(exc, (RuntimeError, ValueError, OSError, TimeoutError, httpx.HTTPError, ModuleNotFoundError))


def describe(exc: BaseException) -> str:
    """`exc` as one line for an operator, with a hint where the fix is known."""
    if isinstance(exc, CloudError):
        return _cloud_error(exc)
    if isinstance(exc, httpx.ConnectError) and _is_certificate_error(exc):
        return (f"the cloud's certificate is not trusted ({_first_line(exc)}): set FL_CA_FILE (or --ca-file) to "
                "the CA that signed it, e.g. ca.pem of `fedctl certs`")
    if isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout)):
        return f"cannot reach the cloud at {_url(exc)} ({_first_line(exc) or type(exc).__name__}): {CLOUD_HINT}"
    if isinstance(exc, httpx.TimeoutException):
        return f"the cloud at {_url(exc)} did not answer in time ({type(exc).__name__})"
    if isinstance(exc, httpx.HTTPError):
        return f"{type(exc).__name__}: {_first_line(exc)}"
    if isinstance(exc, MissingExtra):
        return str(exc)
    if isinstance(exc, ModuleNotFoundError):  # `fedctl up` or `demo` on a device's install: the servers' packages
        return (f"{exc.name} is not installed: this command needs fl-services' extras (pip install "
                "'fl-services[all]')")
    if isinstance(exc, OSError) and exc.filename is not None:
        return f"{exc.filename}: {exc.strerror or exc}"
    if isinstance(exc, ValueError) and type(exc).__name__ == "ValidationError":  # pydantic's, lazily imported
        from fl_services.fedctl.configs import validation_summary

        return validation_summary(exc)
    return " ".join(str(exc).split()) or type(exc).__name__


def _cloud_error(exc: CloudError) -> str:
    said = f"{exc.method} {exc.path}: {exc.status} {exc.detail}"
    if exc.status == 401:
        return f"{said}: {TOKEN_HINT}"
    if exc.status == 403:
        return f"{said}: the cloud refused this caller (mutual TLS: present an admin certificate with FL_CERT_FILE)"
    if exc.status == 404 and exc.path.startswith("/api/v1/runs/"):
        return f"{said}: `fedctl runs` lists the runs"
    return said


def _is_certificate_error(exc: httpx.ConnectError) -> bool:
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, ssl.SSLCertVerificationError):
            return True
        cause = cause.__cause__ or cause.__context__
    return "CERTIFICATE_VERIFY_FAILED" in str(exc)


def _url(exc: httpx.HTTPError) -> str:
    try:
        return str(exc.request.url.copy_with(path="/", query=None)).rstrip("/")
    except RuntimeError:  # no request attached
        return "its address"


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else ""
