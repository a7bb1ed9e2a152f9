"""What the deployment checks (compose, Kubernetes) share: each service package's settings class."""
from __future__ import annotations

from pydantic_settings import BaseSettings

from fl_services.client.config import ClientSettings
from fl_services.cloud.config import CloudSettings
from fl_services.edge.config import EdgeSettings

# package (= Dockerfile suffix) -> (env prefix, settings class)
SETTINGS: dict[str, tuple[str, type[BaseSettings]]] = {
    "cloud": ("FL_CLOUD_", CloudSettings),
    "edge": ("FL_EDGE_", EdgeSettings),
    "client": ("FL_CLIENT_", ClientSettings),
}


def unknown_settings(pkg: str, env: dict[str, str]) -> list[str]:
    """The FL_* variables of `env` that name no field of the package's settings class."""
    prefix, settings_cls = SETTINGS[pkg]
    return [key for key in env if key.startswith("FL_") and
            (not key.startswith(prefix) or key.removeprefix(prefix).lower() not in settings_cls.model_fields)]
