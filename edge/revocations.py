"""The revoked device tokens, as the cloud lists them: refreshed every `revocation_refresh_s`, so that an
administrator can revoke one device's token (fedctl revoke-token) without changing every device's secret."""
from __future__ import annotations

import asyncio
import logging

import httpx
from pydantic import TypeAdapter

log = logging.getLogger(__name__)
_IDS = TypeAdapter(list[str])


class Revocations:
    def __init__(self) -> None:
        self.ids: frozenset[str] = frozenset()
        self.fresh = False  # fetched at least once

    async def refresh(self, cloud: httpx.AsyncClient) -> None:
        response = await cloud.get("/api/v1/edges/revoked-tokens")
        response.raise_for_status()
        self.ids, self.fresh = frozenset(_IDS.validate_json(response.content)), True

    async def run_forever(self, cloud: httpx.AsyncClient, refresh_s: float) -> None:
        failing = False
        while True:
            try:
                await self.refresh(cloud)
                failing = False
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the cloud away: the last list stays in force
                if not failing:
                    log.warning("cannot refresh the revoked device tokens (%s); keeping the last list of %d",
                                exc, len(self.ids))
                failing = True
            await asyncio.sleep(refresh_s)
