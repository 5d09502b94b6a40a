"""Decoded images with their labels: what training, replay buffers and generators pass around."""

from __future__ import annotations

import dataclasses

import torch


@dataclasses.dataclass
class TensorSource:
    """uint8 images (N, C, H, W) and labels, drawn in shuffled passes without replacement."""

    images: torch.Tensor
    labels: torch.Tensor

    def __len__(self) -> int:
        return len(self.labels)

    @staticmethod
    def concat(sources: list["TensorSource"]) -> "TensorSource":
        return TensorSource(torch.cat([s.images for s in sources]), torch.cat([s.labels for s in sources]))
