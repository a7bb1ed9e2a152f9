"""The local-only baseline HFPL is measured against (bench/ and the convergence tests): a client's own extractor
trained alone on its own data."""
from __future__ import annotations

from collections.abc import Callable

import torch.nn.functional as F
from torch import nn

from fl_services.shared.core.algorithms.hfpl.algorithm import HFPL
from fl_services.shared.core.data import ArrayDataset, load_federated
from fl_services.shared.core.seeding import (
    LOCAL_TRAINING,
    MODEL_INIT,
    derive_seed,
    seeded_default_generator,
    torch_generator,
)
from fl_services.shared.core.training import batches


def train_alone(algorithm: HFPL, client_id: int, train: ArrayDataset, epochs: int,
                after_epoch: Callable[[int, nn.Module], None] | None = None) -> nn.Module:
    """The local-only baseline of client i: its extractor (its family, its initial weights) with a private
    linear head, trained on `train` alone by plain cross-entropy with the client's optimiser; returned in
    eval mode. `after_epoch(e, model)` sees the model after e epochs (in eval mode), which is what a run of
    e epochs would return: the epochs' shuffles do not depend on the total."""
    f = algorithm.feature_extractor(client_id, tuple(train.x.shape[1:]))
    num_classes = load_federated(algorithm.config.data, algorithm.config.seed).num_classes
    with seeded_default_generator(derive_seed(algorithm.config.seed, MODEL_INIT, 10_000 + client_id)):
        head = nn.Linear(algorithm.params.feature_dim, num_classes)
    model = nn.Sequential(f, head)
    opt = algorithm.client_optimizer(model.parameters())
    model.train()
    for epoch in range(epochs):
        generator = torch_generator(algorithm.config.seed, LOCAL_TRAINING, epoch, client_id)
        for idx in batches(len(train), algorithm.config.local.batch_size, generator):
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(model(train.x[idx]), train.y[idx]).backward()
            opt.step()
        if after_epoch is not None:
            after_epoch(epoch + 1, model.eval())
            model.train()
    return model.eval()
