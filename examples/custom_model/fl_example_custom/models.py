"""A small convolutional net, as a factory the services call as make_net(input_shape, num_classes, **options)."""
from __future__ import annotations

import torch
from torch import nn


class TinyConvNet(nn.Module):
    """One 3×3 convolution of `channels` filters and a 2×2 max-pool, then a dense hidden layer of `hidden`
    units: about 5k parameters on 8×8 digits, so a federation of a few clients trains in seconds."""

    def __init__(self, input_shape: tuple[int, ...], num_classes: int, channels: int, hidden: int):
        super().__init__()
        in_channels, height, width = input_shape
        self.features = nn.Sequential(nn.Conv2d(in_channels, channels, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2))
        self.classifier = nn.Sequential(
            nn.Flatten(), nn.Linear(channels * (height // 2) * (width // 2), hidden), nn.ReLU(),
            nn.Linear(hidden, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


def make_net(input_shape: tuple[int, ...], num_classes: int, channels: int = 8, hidden: int = 32) -> nn.Module:
    """The factory named in a run config as model.name = "fl_example_custom.models:make_net"; its keyword
    arguments come from model.options (e.g. {"channels": 8, "hidden": 32})."""
    if len(input_shape) != 3:
        raise ValueError(f"make_net needs (channels, height, width) samples, got {input_shape}")
    return TinyConvNet(input_shape, num_classes, channels, hidden)
