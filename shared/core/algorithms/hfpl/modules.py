"""The non-linear kinds of G, HFPL's global classifier (the linear one is torch's nn.Linear)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class CosineClassifier(nn.Linear):
    """G as s·cos(z, w_j) + b_j: the weight rows are class directions, the features' norms do not count."""

    def __init__(self, in_features: int, out_features: int, scale: float):
        super().__init__(in_features, out_features)
        self.scale = scale

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.scale * F.normalize(z, dim=1) @ F.normalize(self.weight, dim=1).T + self.bias


class MLPClassifier(nn.Module):
    """G as W·relu(V z + c) + b, one hidden layer of h units: classes need not be linearly separable in R^d. The
    output layer keeps the linear G's names (weight, bias), the hidden one is hidden.weight, hidden.bias."""

    def __init__(self, in_features: int, out_features: int, width: int):
        super().__init__()
        self.hidden = nn.Linear(in_features, width)
        out = nn.Linear(width, out_features)
        self.weight, self.bias = out.weight, out.bias

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return F.linear(F.relu(self.hidden(z)), self.weight, self.bias)
