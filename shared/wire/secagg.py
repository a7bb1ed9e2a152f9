"""Messages of secure aggregation between a device and its edge (shared/core/secagg/protocol.py). Keys, shares and
ciphertexts travel base64-encoded in JSON; the masked input travels as safetensors (int64 words of Z_2^bits)."""
from __future__ import annotations

import base64
import binascii
from typing import Annotated, ClassVar, Literal

from pydantic import BeforeValidator, Field, PlainSerializer

from fl_services.shared.core.numbers import Int
from fl_services.shared.core.reports import Id, Message
from fl_services.shared.wire.client_edge import ClientResultHeader

MAX_DEVICES = 20_000  # devices in one edge round's protocol

def _from_base64(value: object) -> object:
    if isinstance(value, str):
        try:
            return base64.b64decode(value.encode("ascii"), validate=True)
        except (binascii.Error, UnicodeEncodeError) as exc:
            raise ValueError("not base64") from exc
    return value

PublicKey = Annotated[bytes, BeforeValidator(_from_base64), Field(min_length=32, max_length=32),
                      PlainSerializer(lambda b: base64.b64encode(b).decode("ascii"), return_type=str)]
Blob = Annotated[bytes, BeforeValidator(_from_base64), Field(max_length=512),
                 PlainSerializer(lambda b: base64.b64encode(b).decode("ascii"), return_type=str)]
DeviceId = Annotated[Int, Id]
# A JSON object's keys are strings: a device id as a key is read from one.
DeviceKey = Annotated[int, Id]
Step = Literal["roster", "inbox", "remaining"]

class SecAggKeys(Message):
    """Step 0, after training: the device's public keys, and what the round's history records of its result (its
    update itself comes masked in step 2)."""

    result: ClientResultHeader
    c_pk: PublicKey
    s_pk: PublicKey

class SecAggShares(Message):
    """Step 1: a commitment to the device's mask seed, and its encrypted shares by holder."""

    max_body_bytes: ClassVar[int] = 8 * 2**20
    commitment: PublicKey  # SHA-256: 32 bytes, as a key
    ciphertexts: dict[DeviceKey, Blob] = Field(max_length=MAX_DEVICES)

class SecAggMaskedHeader(Message):
    """Step 2's header: the task it answers (the masked vector is the message's tensor)."""

    task_id: str = Field(min_length=1, max_length=64)
    client_id: Int = Id

class SecAggUnmask(Message):
    """Step 3: the device's shares of the dropped devices' keys and of the remaining devices' seeds."""

    max_body_bytes: ClassVar[int] = 8 * 2**20
    s_shares: dict[DeviceKey, Blob] = Field(max_length=MAX_DEVICES)
    b_shares: dict[DeviceKey, Blob] = Field(max_length=MAX_DEVICES)

class SecAggStep(Message):
    """What the edge relays once a step closes: the roster with the keys and the weight each device multiplies its
    update by (after step 0), the survivors and the shares addressed to this device (after step 1), the devices
    whose masked inputs arrived (after step 2)."""

    max_body_bytes: ClassVar[int] = 8 * 2**20
    step: Step
    threshold: Int = Field(ge=2)
    keys: dict[DeviceKey, tuple[PublicKey, PublicKey]] = Field(default_factory=dict, max_length=MAX_DEVICES)
    weights: dict[DeviceKey, Annotated[Int, Field(ge=1)]] = Field(default_factory=dict, max_length=MAX_DEVICES)
    survivors: list[DeviceId] = Field(default_factory=list, max_length=MAX_DEVICES)
    ciphertexts: dict[DeviceKey, Blob] = Field(default_factory=dict, max_length=MAX_DEVICES)
    remaining: list[DeviceId] = Field(default_factory=list, max_length=MAX_DEVICES)

