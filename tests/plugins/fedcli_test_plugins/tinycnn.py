"""A classifier plugin: a two-stage CNN, with the one cut FedReplay and SplitNN may take (after its stem)."""

from __future__ import annotations

from torch import nn


def tiny_cnn(in_channels: int, num_classes: int) -> nn.Module:
    return nn.Sequential(nn.Conv2d(in_channels, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, num_classes))


def stem(model: nn.Sequential) -> tuple[nn.Module, nn.Module]:
    return model[:4], model[4:]


tiny_cnn.cuts = {"stem": stem}
