"""The synthetic buffer a node shares: class-interleaved labels, uint8 images, prefix-stable.

Images are generated in fixed chunks, each from a stream keyed by (seed, node, "buffer", chunk),
so any prefix of a larger buffer equals the smaller buffer byte for byte, and a node sampled
alone equals the same node sampled with the others.
"""

from __future__ import annotations

import math

import torch

from fedcli.gan.networks import Generator
from fedcli.rng import torch_stream

CHUNK = 64


def to_uint8(images: torch.Tensor) -> torch.Tensor:
    return ((images.clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8)


def interleaved_labels(classes: list[int], n: int) -> torch.Tensor:
    """classes[0], classes[1], ..., classes[-1], classes[0], ...: every prefix is class-balanced."""
    return torch.tensor([classes[i % len(classes)] for i in range(n)], dtype=torch.int64)


@torch.no_grad()
def sample_buffer(generator: Generator, classes: list[int], size: int, seed: int, node: str,
                  device: str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    chunks = math.ceil(size / CHUNK)
    labels = interleaved_labels(classes, chunks * CHUNK)
    images = []
    for k in range(chunks):
        stream = torch_stream(seed, node, "buffer", k)
        z = torch.randn(CHUNK, generator.arch.z_dim, generator=stream)
        y = labels[k * CHUNK:(k + 1) * CHUNK]
        images.append(to_uint8(generator(z.to(device), y.to(device), generator=stream)).cpu())
    return torch.cat(images)[:size], labels[:size]
