"""The Redis adapter's Lua scripts, each a .lua file of this package (package data), registered once per client
(Redis-specific: EVALSHA, falling back to EVAL where the server has not seen a script yet)."""
from __future__ import annotations

from importlib.resources import files
from string import Template

import redis.asyncio as aioredis
from redis.commands.core import AsyncScript

from fl_services.cloud.storage.redis.keys import Entry, Meta
from fl_services.shared.core.reports import RunStatus

_HERE = files(__name__.rpartition(".")[0])
# What submit.lua's placeholders stand for: keys.py's names, written in one place.
_NAMES = dict(status=Meta.status.value, version=Meta.version.value, blob_key=Entry.blob_key.value,
              blob_file=Entry.blob_file.value, header=Entry.header.value, running=RunStatus.running.value,
              paused=RunStatus.paused.value)


def source(name: str) -> str:
    """The text of the script `name`.lua, its placeholders filled in."""
    return Template(_HERE.joinpath(f"{name}.lua").read_text()).substitute(_NAMES)


class Scripts:
    def __init__(self, client: aioredis.Redis):
        self.submit: AsyncScript = client.register_script(source("submit"))
        self.entry_fields: AsyncScript = client.register_script(source("entry_fields"))
        self.lease_extend: AsyncScript = client.register_script(source("lease_extend"))
        self.lease_release: AsyncScript = client.register_script(source("lease_release"))
        self.site_report: AsyncScript = client.register_script(source("site_report"))
        self.site_remove: AsyncScript = client.register_script(source("site_remove"))
