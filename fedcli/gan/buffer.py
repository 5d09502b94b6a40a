"""The synthetic buffer a node shares: class-interleaved labels, uint8 images, prefix-stable.

Images are generated in fixed chunks, each from a stream keyed by (seed, node, "buffer", chunk),
so any prefix of a larger buffer equals the smaller buffer byte for byte, and a node sampled
alone equals the same node sampled with the others. A buffer is read back only through
`load_buffer_file`, which applies the checks its artifact kind names (fedcli/artifact_kinds.py).
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from fedcli.artifact_kinds import buffer_problem, load_recorded
from fedcli.errors import UserError
from fedcli.gan.networks import Generator
from fedcli.layout import BUFFER
from fedcli.rng import torch_stream

CHUNK = 64


def to_uint8(images: torch.Tensor) -> torch.Tensor:
    return ((images.clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8)


def interleaved_labels(classes: list[int], n: int) -> torch.Tensor:
    """classes[0], classes[1], ..., classes[-1], classes[0], ...: every prefix is class-balanced."""
    return torch.tensor([classes[i % len(classes)] for i in range(n)], dtype=torch.int64)


@torch.no_grad()
def sample_buffer(generator: Generator, classes: list[int], size: int, seed: int, node: str,
                  device: str = "cpu", truncation: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    chunks = math.ceil(size / CHUNK)
    labels = interleaved_labels(classes, chunks * CHUNK)
    images = []
    for k in range(chunks):
        stream = torch_stream(seed, node, "buffer", k)
        z = torch.randn(CHUNK, generator.arch.z_dim, generator=stream)
        y = labels[k * CHUNK:(k + 1) * CHUNK]
        made = generator(z.to(device), y.to(device), generator=stream, truncation=truncation)
        if not made.isfinite().all():  # uint8 would turn NaN into black images that federate trains on
            raise UserError(f"node {node}'s generator makes non-finite images (its training diverged); re-run "
                            "fedcli train-gan --overwrite with a lower --lr")
        images.append(to_uint8(made).cpu())
    return torch.cat(images)[:size], labels[:size]


def load_buffer_file(folder: Path, node: str, manifest, classes: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Node `node`'s buffer from its GAN folder: as its config.json recorded, made for this node and this
    partition (`manifest`), uint8 images of the partition's shape, one label per image from `classes`."""
    what, fix = f"buffer of node {node}", f"re-run fedcli train-gan --node {node} --overwrite"
    tensors, _ = load_recorded(Path(folder) / BUFFER, what, fix,
                            expect={"node": node, "manifest": manifest.content_hash})
    images, labels = tensors.get("images"), tensors.get("labels")
    shape = (manifest["channels"], manifest["image_size"], manifest["image_size"])
    problem = buffer_problem(images, labels, shape, manifest.num_classes, classes)
    if problem:
        raise UserError(f"{what} at {Path(folder) / BUFFER} {problem}; {fix}")
    return images, labels
