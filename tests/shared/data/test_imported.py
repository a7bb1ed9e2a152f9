"""A researcher's own data loader (data.dataset = "package.module:load"), in each form the contract allows."""
import numpy as np
import pytest

from fl_services.shared.core.config import DataConfig
from fl_services.shared.core.data import load_federated
from fl_services.shared.core.user_code import UserCodeError
from tests.shared.user_factories import N_TRAIN

LOADERS = "tests.shared.user_factories"


def first_feature(ds) -> np.ndarray:
    return ds.x.reshape(len(ds), -1)[:, 0].numpy() / 6


def test_dict_with_client_index_feeds_partition_file():
    data = load_federated(DataConfig(dataset=f"{LOADERS}:as_dict", options={"num_clients": 4}, partition="file",
                                     num_clients=4), 0)
    assert data.input_shape == (2, 3) and data.num_classes == 3
    for k, client in enumerate(data.clients):
        rows = np.concatenate([first_feature(client.train), first_feature(client.test)])
        np.testing.assert_array_equal(np.sort(rows), np.arange(k, N_TRAIN, 4))
        assert (len(client.train), len(client.test)) == (8, 2)


def test_declared_num_classes_is_kept():
    data = load_federated(DataConfig(dataset=f"{LOADERS}:as_dict", options={"num_classes": 7}), 0)
    assert data.num_classes == 7


@pytest.mark.parametrize("loader", ["as_tensor_pairs", "as_datasets"])
def test_tensor_pairs_and_torch_datasets_are_split_by_the_partitioner(loader):
    data = load_federated(DataConfig(dataset=f"{LOADERS}:{loader}", partition="iid", num_clients=5), 0)
    rows = np.concatenate([first_feature(s) for c in data.clients for s in (c.train, c.test)])
    np.testing.assert_array_equal(np.sort(rows), np.arange(N_TRAIN))
    assert len(data.test) == 10 and data.num_classes == 3


def test_a_returned_client_index_serves_partition_file():
    data = load_federated(DataConfig(dataset=f"{LOADERS}:as_datasets", partition="file", num_clients=2), 0)
    assert [len(c.train) + len(c.test) for c in data.clients] == [20, 20]


@pytest.mark.parametrize("holdout, sizes", [(0.0, (10, 0)), (0.2, (8, 2)), (0.5, (5, 5))])
def test_client_holdout_sets_each_clients_held_out_share(holdout, sizes):
    cfg = DataConfig(dataset=f"{LOADERS}:as_dict", partition="file", num_clients=4, client_holdout=holdout)
    data = load_federated(cfg, 0)
    assert {(len(c.train), len(c.test)) for c in data.clients} == {sizes}


@pytest.mark.parametrize("dataset, options, message", [
    ("tests.shared.no_such_module:load", {}, "cannot import the data loader .* No module named"),
    (f"{LOADERS}:nothing", {}, "has no function 'nothing'"),
    (f"{LOADERS}:as_dict", {"colour": 1}, "raised TypeError: .*unexpected keyword argument 'colour'"),
    (f"{LOADERS}:missing_key", {}, r"lacks \['y_test'\]"),
    (f"{LOADERS}:wrong_type", {}, "returned a list"),
    (f"{LOADERS}:as_dict", {"num_classes": 2}, "num_classes 2 must be an integer above the largest label 2"),
    (f"{LOADERS}:with_nan", {}, "x_train holds NaN or infinite values"),
    (f"{LOADERS}:as_dict", {"num_classes": 10**6}, "1000000 classes .*, over the 100000 allowed"),
])
def test_a_broken_loader_says_whose_and_what(dataset, options, message):
    with pytest.raises(UserCodeError, match=message):
        load_federated(DataConfig(dataset=dataset, options=options), 0)


def test_partition_file_without_a_client_index_is_refused():
    with pytest.raises(ValueError, match="partition 'file' needs a client_train array in .*as_tensor_pairs"):
        load_federated(DataConfig(dataset=f"{LOADERS}:as_tensor_pairs", partition="file", num_clients=2), 0)


@pytest.mark.parametrize("fields, message", [
    ({"dataset": "cifar10"}, "data.dataset must be one of mnist5k, digits, npz, synthetic, mnist1d or an import path"),
    ({"dataset": "digits", "options": {"n": 1}}, "data.options are the keyword arguments of an imported loader"),
    ({"dataset": "digits", "partition": "file"}, "partition 'file' uses the client index stored with the data"),
    ({"dataset": "synthetic", "partition": "natural", "client_holdout": 0}, "client_holdout must be above 0"),
    ({"client_holdout": 1}, "less than 1"),
    ({"client_holdout": -0.1}, "greater than or equal to 0"),
])
def test_data_config_refuses(fields, message):
    with pytest.raises(ValueError, match=message):
        DataConfig(**fields)
