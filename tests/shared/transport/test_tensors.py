import pytest
import torch

from shared.schemas import ClientResultHeader
from shared.transport.tensors import InvalidContent, PayloadError, check_tensors, decode, encode, spec_of


def header() -> ClientResultHeader:
    return ClientResultHeader(task_id="t", client_id=3, num_samples=7, loss=0.5)


def test_roundtrip_is_bit_exact_and_typed():
    tensors = {"w": torch.randn(3, 4), "b": torch.arange(5, dtype=torch.float64)}
    got, h = decode(encode(tensors, header()), ClientResultHeader)
    assert h == header()
    assert got.keys() == tensors.keys()
    for name in tensors:
        assert torch.equal(got[name], tensors[name]) and got[name].dtype == tensors[name].dtype


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
