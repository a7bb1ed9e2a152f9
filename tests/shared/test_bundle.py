"""The task bundle: several task messages in one body, each named before its bytes are read, the data they
share sent once."""
from __future__ import annotations

import json
import struct

import pytest

from fl_services.shared.core.tensors import PayloadError
from fl_services.shared.wire.bundle import pack, unpack


def test_a_bundle_reads_back_in_order_and_sends_shared_data_once() -> None:
    shared, other = b"d" * 1000, b"e" * 10
    items = [(3, "t3", b"h3", shared), (1, "t1", b"", other), (7, "t7", b"h7h7", shared)]
    body = pack(items)
    assert [(i.client_id, i.task_id, i.head, i.data) for i in unpack(body)] == items
    assert unpack(body)[2].message() == b"h7h7" + shared
    assert len(body) < 2000  # the 1,000 shared bytes once
    assert unpack(pack([])) == []


def index(raw: dict) -> bytes:
    text = json.dumps(raw).encode()
    return struct.pack("<Q", len(text)) + text


@pytest.mark.parametrize("body", [
    b"", b"\x01", struct.pack("<Q", 100) + b"[]",  # too short; header longer than the body
    index([]),  # not an index
    index({"items": [{"client_id": 0, "task_id": "t", "head": 0, "data": 0}], "segments": []}),  # no segment 0
    index({"items": [{"client_id": -1, "task_id": "t", "head": 0, "data": 0}], "segments": [0]}),  # negative id
    index({"items": [], "segments": [-3]}) + b"abc",  # a negative size
    pack([(0, "t", b"h", b"abc")])[:-1],  # sizes beyond the body
    pack([(0, "t", b"h", b"abc")]) + b"surplus",  # bytes no item accounts for
])
def test_a_malformed_bundle_is_a_payload_error(body: bytes) -> None:
    with pytest.raises(PayloadError):
        unpack(body)
