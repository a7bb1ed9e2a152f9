"""The task bundle: several task messages in one body, each named before its bytes are read."""
from __future__ import annotations

import struct

import pytest

from shared.transport.bundle import pack, unpack
from shared.transport.tensors import PayloadError


def test_a_bundle_reads_back_in_order() -> None:
    items = [(3, "t3", b"abc"), (1, "t1", b""), (7, "t7", b"x" * 1000)]
    assert [(i.client_id, i.task_id, blob) for i, blob in unpack(pack(items))] == items
    assert unpack(pack([])) == []


@pytest.mark.parametrize("body", [
    b"", b"\x01", struct.pack("<Q", 100) + b"[]",  # too short; header longer than the body
    struct.pack("<Q", 2) + b"{}",  # not a list
    struct.pack("<Q", 5) + b"[1,2]",  # not items
    pack([(0, "t", b"abc")])[:-1],  # sizes beyond the body
    pack([(0, "t", b"abc")]) + b"surplus",  # bytes no item accounts for
    struct.pack("<Q", 42) + b'[{"client_id":-1,"task_id":"t","size":0}]',  # a negative id
])
def test_a_malformed_bundle_is_a_payload_error(body: bytes) -> None:
    with pytest.raises(PayloadError):
        unpack(body)
