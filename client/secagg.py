"""A device's side of secure aggregation (shared/core/secagg/protocol.py) over its edge's HTTP API: the device
dials out for every step, posting what it sends and long-polling what the edge relays. Its update leaves it only
masked; a step the edge closes without it (409) ends its part, as a dropped device."""
from __future__ import annotations

import asyncio
import logging
from typing import Any

import httpx
import torch

from fl_services.client.feed import check
from fl_services.shared.core.records import Record, encode
from fl_services.shared.core.secagg import fixedpoint
from fl_services.shared.core.secagg.protocol import DeviceSession, ProtocolViolation
from fl_services.shared.core.secagg.sites import MASKED
from fl_services.shared.wire.client_edge import ClientResultHeader, ClientTaskHeader
from fl_services.shared.wire.http import binary_body
from fl_services.shared.wire.retry import DEDUPLICATED
from fl_services.shared.wire.secagg import (
    SecAggKeys,
    SecAggMaskedHeader,
    SecAggShares,
    SecAggStep,
    SecAggUnmask,
    Step,
)

log = logging.getLogger(__name__)


class RoundOver(Exception):
    """The edge closed a step without this device, or the round failed (409): its part ends."""


class SecureUpload:
    """Sends one trained task's update through the protocol: `run` returns once the device has sent its last step."""

    def __init__(self, edge: httpx.AsyncClient, auth: dict[str, str], task: ClientTaskHeader, poll_s: float):
        assert task.secure_round is not None
        self.edge, self.auth, self.task, self.poll_s = edge, auth, task, poll_s
        self.url = f"/api/v1/clients/{task.client_id}/secagg/{task.task_id}"
        self.session = DeviceSession(task.client_id, task.secure_round.encode(), task.config.secure_aggregation.bits)

    async def run(self, update: Record, result: ClientResultHeader) -> bool:
        """False where the round went on without this device (or failed)."""
        try:
            await self._steps(update, result)
        except RoundOver as exc:
            log.info("client %d: secure round %s went on without it: %s", self.task.client_id,
                     self.task.secure_round, exc)
            return False
        return True

    async def _steps(self, update: Record, result: ClientResultHeader) -> None:
        config = self.task.config.secure_aggregation
        c_pk, s_pk = self.session.keys()
        await self._post("keys", json=SecAggKeys(result=result, c_pk=c_pk, s_pk=s_pk).model_dump(mode="json"))
        roster = await self._wait("roster")
        me = self.task.client_id
        try:
            commitment, ciphertexts = self.session.share(dict(roster.keys), roster.threshold)
        except ProtocolViolation as exc:
            raise RoundOver(f"the edge's roster is refused: {exc}") from exc
        await self._post("shares", json=SecAggShares(commitment=commitment, ciphertexts=ciphertexts)
                         .model_dump(mode="json"))
        inbox = await self._wait("inbox")
        # The weight the edge counts this device with (its sample count as the edge caps it, or 1): public, as
        # the history records it; the device multiplies by it so that the sum is the weighted sum.
        vector = await asyncio.to_thread(fixedpoint.encode, update, roster.weights[me], config.clip,
                                         config.scale_bits, config.bits)
        try:
            masked = await asyncio.to_thread(self.session.mask, vector, dict(inbox.ciphertexts), inbox.survivors)
        except ProtocolViolation as exc:
            raise RoundOver(f"the edge's survivors are refused: {exc}") from exc
        words = torch.from_numpy(masked.view("int64").copy())
        blob = encode({MASKED: {MASKED: words}}, SecAggMaskedHeader(task_id=self.task.task_id, client_id=me))
        await self._post("masked", **binary_body(blob, self.auth))
        remaining = await self._wait("remaining")
        try:
            s_shares, b_shares = self.session.unmask(remaining.remaining)
        except ProtocolViolation as exc:
            raise RoundOver(f"the edge's remaining devices are refused: {exc}") from exc
        await self._post("unmask", json=SecAggUnmask(s_shares=s_shares, b_shares=b_shares).model_dump(mode="json"))

    async def _post(self, step: str, **body: Any) -> None:
        headers = body.pop("headers", self.auth)
        # Re-sent through a passing fault: a repeated step replaces the same message.
        response = await self.edge.post(f"{self.url}/{step}", headers=headers, extensions=DEDUPLICATED, **body)
        if response.status_code == 409:
            raise RoundOver(response.text[:300])
        check(response)

    async def _wait(self, step: Step) -> SecAggStep:
        while True:
            response = await self.edge.get(f"{self.url}/{step}", params={"timeout": self.poll_s}, headers=self.auth)
            if response.status_code == 409:
                raise RoundOver(response.text[:300])
            check(response)
            if response.status_code == 200:
                return SecAggStep.model_validate_json(response.content)
