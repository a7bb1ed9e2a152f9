"""A data loader, named in a run config as data.dataset = "fl_example_custom.data:load".

scikit-learn's handwritten digits (bundled with it: nothing is downloaded), with a natural partition:
the services call load(**data.options) in every process, so it is deterministic.
"""
from __future__ import annotations

import numpy as np
from sklearn.datasets import load_digits


def load(num_clients: int = 4, test_share: float = 0.2) -> dict[str, np.ndarray]:
    """x of shape (N, 1, 8, 8) standardised (zero mean, unit variance over all pixels), labels 0-9, and a
    client index for partition "file": the training rows dealt to the clients in turn, as if they had come
    from the devices in turn. The last `test_share` of the rows is the global test set."""
    digits = load_digits()
    x = digits.images[:, None]
    x = ((x - x.mean()) / x.std()).astype(np.float32)
    y = digits.target.astype(np.int64)
    cut = round(len(y) * (1 - test_share))
    return {
        "x_train": x[:cut], "y_train": y[:cut], "x_test": x[cut:], "y_test": y[cut:],
        "client_train": np.arange(cut) % num_clients,
    }
