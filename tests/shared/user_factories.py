"""A researcher's code as the tests import it by path ("tests.shared.user_factories:..."): model factories
and data loaders in the forms the contract allows, and some that break it."""
import sys
import threading

import numpy as np
import torch
from torch import nn

N_TRAIN, N_TEST = 40, 10


def two_layer(input_shape, num_classes, width=4):
    return nn.Sequential(nn.Flatten(), nn.Linear(int(np.prod(input_shape)), width), nn.ReLU(),
                         nn.Linear(width, num_classes))


def not_a_module(input_shape, num_classes):
    return "a string"


def broken(input_shape, num_classes):
    raise RuntimeError("the researcher's bug")


def exits(input_shape, num_classes):
    sys.exit("usage: train.py [--width W]")  # as argparse does on options it does not know


def exiting_loader():
    sys.exit(2)


# Set by the test that uses `hangs`, so that the threads it leaves behind end with it.
RELEASE = threading.Event()


def hangs():
    """A loader waiting on something that does not come (a download from a host that never answers)."""
    RELEASE.wait(60)
    return as_dict()


def _arrays():
    x = np.arange(N_TRAIN * 6, dtype=np.float64).reshape(N_TRAIN, 2, 3)
    return x, np.arange(N_TRAIN) % 3, np.full((N_TEST, 2, 3), -1.0), np.arange(N_TEST) % 3


def as_dict(num_clients=4, num_classes=None):
    x, y, xt, yt = _arrays()
    out = {"x_train": x, "y_train": y, "x_test": xt, "y_test": yt, "client_train": np.arange(N_TRAIN) % num_clients}
    if num_classes is not None:
        out["num_classes"] = num_classes
    return out


def as_tensor_pairs():
    x, y, xt, yt = (torch.as_tensor(a) for a in _arrays())
    return (x.float(), y), (xt.float(), yt)


class _Samples(torch.utils.data.Dataset):
    def __init__(self, x, y):
        self.x, self.y = x, y

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return torch.as_tensor(self.x[i], dtype=torch.float32), int(self.y[i])


def as_datasets():
    x, y, xt, yt = _arrays()
    return _Samples(x, y), torch.utils.data.TensorDataset(torch.as_tensor(xt).float(), torch.as_tensor(yt)),\
        np.arange(N_TRAIN) % 2


def missing_key():
    out = as_dict()
    del out["y_test"]
    return out


def with_nan():
    out = as_dict()
    out["x_train"][3, 1, 2] = np.nan
    return out


def nan_weights(input_shape, num_classes):
    model = two_layer(input_shape, num_classes)
    with torch.no_grad():
        model[1].bias[0] = float("nan")
    return model


def wrong_type():
    return [1, 2, 3]


def wrong_classes(input_shape, num_classes):
    """Logits for one class too many: builds and runs, but cannot be trained against these labels."""
    return two_layer(input_shape, num_classes + 1)


def device_data(samples=30, test_samples=0):
    """A device's own loader (data source "import:"): a mapping of x, y and, given test_samples, x_test, y_test."""
    x = np.arange(samples * 6, dtype=np.float64).reshape(samples, 2, 3)
    out = {"x": x, "y": np.arange(samples) % 3}
    if test_samples:
        out |= {"x_test": -np.ones((test_samples, 2, 3)), "y_test": np.zeros(test_samples, dtype=np.int64)}
    return out


def device_pair(samples=30):
    x, y = device_data(samples)["x"], device_data(samples)["y"]
    return torch.as_tensor(x).float(), torch.as_tensor(y)


def device_datasets():
    x, y, xt, yt = _arrays()
    return _Samples(x, y), (xt, yt)


def device_strings():
    return {"x": [["a", "b"], ["c", "d"]], "y": [0, 1]}


class _BrokenSamples(torch.utils.data.Dataset):
    """A Dataset whose samples fail when read, as a transform failing inside torch does."""

    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int):
        raise RuntimeError("a transform failed")


def device_broken_dataset():
    return _BrokenSamples()
