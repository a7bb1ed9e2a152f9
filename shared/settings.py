"""The base of each service's settings class: environment variables over a TOML file over defaults.

Each service (cloud, edge, client) has exactly one settings class with its own env prefix, e.g.
FL_CLOUD_REDIS_URL; FL_CLOUD_CONFIG_FILE names an optional TOML file with the same keys.
"""
from __future__ import annotations

import os

from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, TomlConfigSettingsSource


class ServiceSettings(BaseSettings):
    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        prefix = settings_cls.model_config.get("env_prefix", "")
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        config_file = os.environ.get(f"{prefix}CONFIG_FILE")
        if config_file:
            sources.append(TomlConfigSettingsSource(settings_cls, toml_file=config_file))
        return tuple(sources)
