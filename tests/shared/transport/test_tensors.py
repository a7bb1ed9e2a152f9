import json
import re
import struct

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fl_services.shared.core.tensors import InvalidContent, PayloadError, check_tensors, decode, encode, spec_of
from fl_services.shared.wire.client_edge import ClientResultHeader


def header() -> ClientResultHeader:
    return ClientResultHeader(task_id="t", client_id=3, num_samples=7, loss=0.5)


def test_roundtrip_is_bit_exact_and_typed():
    tensors = {"w": torch.randn(3, 4), "b": torch.arange(5, dtype=torch.float64)}
    got, h = decode(encode(tensors, header()), ClientResultHeader)
    assert h == header()
    assert got.keys() == tensors.keys()
    for name in tensors:
        assert torch.equal(got[name], tensors[name]) and got[name].dtype == tensors[name].dtype


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64,
                                   torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool])
def test_every_dtype_is_written_as_safetensors_torch_writer_writes_it(dtype):
    """The numpy writer (used where it can, for speed) and the torch writer (bfloat16) make the same bytes."""
    from safetensors.torch import save

    tensors = {"w": (torch.randn(3, 4) * 9).to(dtype), "scalar": torch.tensor(2).to(dtype),
               "empty": torch.zeros(0, 2, dtype=dtype), "strided": (torch.randn(4, 3) * 9).to(dtype).t()}
    metadata = {"message": header().model_dump_json()}
    assert encode(tensors, header()) == save({k: v.contiguous() for k, v in tensors.items()}, metadata=metadata)
    got, _ = decode(encode(tensors, header()), ClientResultHeader)
    assert all(torch.equal(got[k], v) and got[k].dtype == dtype for k, v in tensors.items())


@pytest.mark.parametrize("blob", [b"", b"abc", b"\xff" * 8 + b"{}", (10).to_bytes(8, "little") + b"not json!!"])
def test_garbage_is_a_payload_error(blob):
    with pytest.raises(PayloadError):
        decode(blob, ClientResultHeader)


def test_missing_message_header():
    from safetensors.torch import save

    with pytest.raises(PayloadError, match="no 'message'"):
        decode(save({"w": torch.zeros(2)}), ClientResultHeader)


def test_invalid_header_is_invalid_content():
    header = ClientResultHeader.model_construct(task_id="t", client_id=-1, num_samples=0, loss=0.0)
    bad = encode({"w": torch.zeros(1)}, header)
    with pytest.raises(InvalidContent):
        decode(bad, ClientResultHeader)


@pytest.mark.parametrize(
    "tensors, match",
    [
        ({"w": torch.zeros(2, 2)}, "missing"),
        ({"w": torch.zeros(2, 2), "b": torch.zeros(2), "x": torch.zeros(1)}, "unexpected"),
        ({"w": torch.zeros(2, 3), "b": torch.zeros(2)}, "shape"),
        ({"w": torch.zeros(2, 2, dtype=torch.float64), "b": torch.zeros(2)}, "dtype"),
        ({"w": torch.tensor([[0.0, float("nan")], [0, 0]]), "b": torch.zeros(2)}, "NaN"),
        ({"w": torch.zeros(2, 2), "b": torch.tensor([float("inf"), 0.0])}, "NaN or Inf"),
    ],
)
def test_check_tensors_names_each_violation(tensors, match):
    expected = spec_of({"w": torch.zeros(2, 2), "b": torch.zeros(2)})
    with pytest.raises(InvalidContent, match=match):
        check_tensors(tensors, expected)


# ---- malformed safetensors headers: always a PayloadError (a 4xx), never anything else (a 500) ----------
_scalars = st.one_of(st.none(), st.booleans(), st.floats(), st.text(max_size=20),
                     st.integers(-(2**70), 2**70), st.sampled_from(["F32", "U8", "I64", "F8_E8M0", "BOOL"]))
_json = st.recursive(_scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                         st.dictionaries(st.text(max_size=8), inner, max_size=4)),
                     max_leaves=12)
# A number token JSON writes as-is but Python refuses to read: more digits than int() converts (4,300).
_long_number = st.integers(4301, 6000).map(lambda n: "9" * n)


@st.composite
def malformed_headers(draw) -> bytes:
    """A safetensors document with a header that is close to valid where it matters: the tensor entry's
    fields, the metadata and the message take arbitrary JSON values, or an overlong integer anywhere."""
    entry = {"dtype": draw(st.one_of(st.just("F32"), _json)), "shape": draw(st.one_of(st.just([2]), _json)),
             "data_offsets": draw(st.one_of(st.just([0, 8]), _json))}
    metadata = draw(st.one_of(st.just({"message": header().model_dump_json()}), _json,
                              st.dictionaries(st.just("message"), _json.map(json.dumps))))
    document = {"w": draw(st.one_of(st.just(entry), _json)), "__metadata__": metadata}
    text = json.dumps(draw(st.one_of(st.just(document), _json)))
    if draw(st.booleans()):  # an overlong integer in place of one of the numbers (or appended to the text)
        numbers = re.findall(r"-?\d+", text) or [""]
        text = text.replace(draw(st.sampled_from(numbers)) or text, draw(_long_number), 1)
    raw = text.encode()
    if draw(st.booleans()):  # or the bytes themselves broken
        raw = draw(st.binary(max_size=16)) + raw[draw(st.integers(0, len(raw))):]
    data = draw(st.binary(max_size=16))
    return struct.pack("<Q", len(raw)) + raw + data


@settings(max_examples=100, deadline=None, derandomize=True, database=None)
@given(blob=malformed_headers())
def test_any_malformed_header_is_a_payload_error(blob):
    try:
        decode(blob, ClientResultHeader)
    except PayloadError:  # 400 (422 for InvalidContent): what the services answer
        pass


@pytest.mark.parametrize("bad", ["a", "b", "c", "d"])
def test_checks_read_many_tensors_at_once_and_still_name_the_one_at_fault(bad):
    from fl_services.shared.core.tensors import check_magnitude
    # Small tensors of several float dtypes (checked as one) and one large one (checked on its own).
    good = {"a": torch.zeros(3, dtype=torch.float16), "b": torch.ones(4, 5), "c": torch.zeros(2, dtype=torch.float64),
            "d": torch.zeros(1 << 20), "n": torch.arange(3)}
    check_tensors(good, spec_of(good))
    check_magnitude(good)
    nan, huge = dict(good), dict(good)
    nan[bad] = good[bad].clone().reshape(-1).index_fill(0, torch.tensor([1]), float("nan")).reshape(good[bad].shape)
    huge[bad] = good[bad].clone().reshape(-1).index_fill(0, torch.tensor([1]), -6e4).reshape(good[bad].shape)
    with pytest.raises(InvalidContent, match=f"tensor '{bad}' contains NaN or Inf"):
        check_tensors(nan, spec_of(good))
    check_magnitude(huge, bound=1e6)
    with pytest.raises(InvalidContent, match=f"tensor '{bad}' has values beyond"):
        check_magnitude(huge, bound=5e4)
    check_magnitude(huge, bound=5e4, names=[name for name in good if name != bad])
