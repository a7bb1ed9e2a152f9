"""The record codec: named groups flattened only here, and containers packed by id."""
from dataclasses import dataclass

import pytest
import torch

from fl_services.shared.core.records import decode, decode_state, encode, flatten, pack, unflatten, unpack
from fl_services.shared.core.tensors import InvalidContent, PayloadError
from fl_services.shared.core.tensors import encode as encode_flat
from fl_services.shared.wire.client_edge import ClientResultHeader


def header() -> ClientResultHeader:
    return ClientResultHeader(task_id="t", client_id=1, num_samples=3, loss=0.5)


def test_a_record_round_trips_whatever_its_parameter_names_hold():
    # A parameter name may hold "/" or "." (only a group name may not): it splits at the first "/".
    record = {"model": {"fc1.weight": torch.ones(2, 3), "odd/name": torch.zeros(1)},
              "control": {"fc1.weight": torch.full((2, 3), 2.0)}}
    got, h = decode(encode(record, header()), ClientResultHeader)
    assert h == header()
    assert got.keys() == record.keys()
    for group, tensors in record.items():
        assert got[group].keys() == tensors.keys()
        assert all(torch.equal(got[group][n], t) for n, t in tensors.items())
    assert set(flatten(record)) == {"model/fc1.weight", "model/odd/name", "control/fc1.weight"}


@pytest.mark.parametrize("group", ["", "a/b"])
def test_a_group_name_that_could_not_be_read_back_is_refused(group):
    with pytest.raises(ValueError, match="group name"):
        flatten({group: {"w": torch.zeros(1)}})


def test_a_tensor_without_a_group_is_invalid_content():
    with pytest.raises(InvalidContent, match="'w' names no group"):
        decode(encode_flat({"w": torch.zeros(1)}, header()), ClientResultHeader)
    with pytest.raises(InvalidContent, match="'/w' names no group"):
        unflatten({"/w": torch.zeros(1)})


@dataclass(frozen=True)
class Kept:
    means: torch.Tensor
    features: torch.Tensor


def test_containers_pack_by_id_with_rows_of_any_length():
    items = {7: Kept(torch.ones(3, 2, dtype=torch.float64), torch.zeros(0, 4)),
             2: Kept(torch.full((3, 2), 2.0, dtype=torch.float64), torch.arange(8.0).reshape(2, 4))}
    group = pack(items)
    assert torch.equal(group["ids"], torch.tensor([2, 7]))
    assert torch.equal(group["rows"], torch.tensor([[3, 2], [3, 0]]))
    back = unpack(decode_state(encode({"kept": group}))["kept"], Kept)
    assert sorted(back) == [2, 7]
    for k, item in items.items():
        assert torch.equal(back[k].means, item.means) and torch.equal(back[k].features, item.features)
    assert pack({}) == {} and unpack({}, Kept) == {}


def test_a_packed_group_with_other_tensors_is_refused():
    group = pack({0: Kept(torch.ones(1), torch.ones(1))})
    with pytest.raises(PayloadError, match="expected"):
        unpack({**group, "extra": torch.ones(1)}, Kept)
