"""A client's held-out figures under HFPL: its f_i with the global (C̄, G) it received, as it reports them with
each result and as a served model is measured."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from fl_services.shared.core.algorithms.hfpl.layout import ACCURACY, PROTO_ACCURACY, TEST_LOSS
from fl_services.shared.core.algorithms.hfpl.params import HFPLParams
from fl_services.shared.core.data import ArrayDataset


@torch.no_grad()
def held_out_figures(params: HFPLParams, f: nn.Module, g: nn.Module, prototypes: torch.Tensor, exists: torch.Tensor,
                     own: torch.Tensor, test: ArrayDataset) -> dict[str, float]:
    """Held-out figures of f_i on `test`: ACCURACY is the configured inference's, PROTO_ACCURACY the nearest
    C̄_j's (once some exists), TEST_LOSS G's cross-entropy over all classes. With own_classes, both
    predict among the classes in `own` (the client's training labels) only."""
    if len(test) == 0:
        return {}
    z = f(test.x)
    logits = g(z)
    allowed = torch.ones(logits.shape[1], dtype=torch.bool, device=logits.device)
    if params.own_classes:
        allowed = torch.zeros_like(allowed).index_fill_(0, own.unique(), True)
    predicted = {ACCURACY: logits.masked_fill(~allowed, -math.inf).argmax(1)}
    if bool(exists.any()):
        distance = torch.cdist(z.to(torch.float64), prototypes)
        distance[:, ~(exists & allowed)] = math.inf
        predicted[PROTO_ACCURACY] = distance.argmin(1)
    if params.inference == "nearest_prototype":
        # Until some C̄_j exists (a client's first round) there is nothing to be near: G answers.
        predicted[ACCURACY] = predicted.get(PROTO_ACCURACY, predicted[ACCURACY])
    metrics = {name: float((p == test.y).float().mean()) for name, p in predicted.items()}
    return {**metrics, TEST_LOSS: float(F.cross_entropy(logits, test.y))}
