"""G, HFPL's global classifier: made of the configured kind, loaded from its state dict (HEAD's tensors), and
trained by the cloud on the features the edges send."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from fl_services.shared.core.algorithms.hfpl.layout import HIDDEN_WEIGHT, WEIGHT
from fl_services.shared.core.algorithms.hfpl.modules import CosineClassifier, MLPClassifier
from fl_services.shared.core.algorithms.hfpl.params import HFPLParams
from fl_services.shared.core.device import current, on_cpu
from fl_services.shared.core.seeding import CLASSIFIER, torch_generator
from fl_services.shared.core.tensors import Tensors
from fl_services.shared.core.training import batches


def new_classifier(params: HFPLParams, d: int, num_classes: int) -> nn.Module:
    """A freshly initialised G of the configured kind (drawing from the default generator)."""
    if params.classifier == "cosine":
        return CosineClassifier(d, num_classes, params.classifier_scale)
    if params.classifier == "mlp":
        return MLPClassifier(d, num_classes, params.classifier_width)
    return nn.Linear(d, num_classes)


def load_classifier(params: HFPLParams, head: Tensors, trainable: bool) -> nn.Module:
    """G of the configured kind with the given state dict (HEAD's tensors)."""
    hidden = head.get(HIDDEN_WEIGHT, head[WEIGHT])  # the layer that reads z: (h or J, d)
    g = new_classifier(params, hidden.shape[1], head[WEIGHT].shape[0])
    g.load_state_dict(head)
    g.requires_grad_(trainable)
    return g


def state_of(g: nn.Module) -> Tensors:
    """G's state dict, detached copies: what HEAD holds."""
    return {name: t.detach().clone() for name, t in g.state_dict().items()}


def train_classifier(params: HFPLParams, seed: int, head: Tensors, x: torch.Tensor, y: torch.Tensor,
                     round: int) -> Tensors:
    """G ← a few epochs of minibatch SGD on cross-entropy over X, from the current G (its state dict), on the
    compute device (shared/core/device.py); the batch order is drawn on the CPU."""
    device = current()
    g = load_classifier(params, head, trainable=True).to(device)
    x, y = x.to(device), y.to(device)
    opt = torch.optim.SGD(g.parameters(), lr=params.classifier_lr)
    generator = torch_generator(seed, CLASSIFIER, round)
    for _ in range(params.classifier_epochs):
        for idx in batches(len(y), params.classifier_batch_size, generator):
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(g(x[idx]), y[idx]).backward()
            opt.step()
    return on_cpu(state_of(g))
