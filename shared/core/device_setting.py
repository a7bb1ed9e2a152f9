"""A settings field holding a device setting (the client's and the cloud's `device`), checked when the settings
are read, at a service's start. Apart from device.py, which imports torch: the default, cpu, is checked without
it, so a service's --help and its other settings errors answer before torch loads."""
from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator


def _checked(spec: str) -> str:
    if spec.strip().lower() != "cpu":  # any other asks torch what this machine has (device.resolve)
        from fl_services.shared.core.device import resolve
        resolve(spec)
    return spec


DeviceSetting = Annotated[str, AfterValidator(_checked)]
