"""The synthetic buffer a node shares: uint8 images and their labels, whatever kind of generator made them.

A sampled buffer has class-interleaved labels and is prefix-stable: images are generated in fixed chunks,
each from a stream keyed by (seed, node, "buffer", chunk), so any prefix of a larger buffer equals the
smaller buffer byte for byte, and a node sampled alone equals the same node sampled with the others. A
decoded buffer (a kind that decodes codes of the node's real images) is written as the kind made it and
flagged `decoded` in its metadata. A buffer is read back only through `load_buffer_file`, which applies
the checks its artifact kind names (fedcli/experiment/artifact_kinds.py).
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from fedcli.core.errors import UserError
from fedcli.core.rng import torch_stream
from fedcli.experiment.artifact_kinds import buffer_problem, load_recorded
from fedcli.experiment.paths import BUFFER
from fedcli.generators.protocol import Sampler

CHUNK = 64
LAYOUT = "images uint8 NCHW, labels int64"
DECODED = "codes of the node's real images, decoded"  # the metadata's `decoded`, when the buffer is one


def to_uint8(images: torch.Tensor) -> torch.Tensor:
    return ((images.clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8)


def interleaved_labels(classes: list[int], n: int) -> torch.Tensor:
    """classes[0], classes[1], ..., classes[-1], classes[0], ...: every prefix is class-balanced."""
    return torch.tensor([classes[i % len(classes)] for i in range(n)], dtype=torch.int64)


@torch.no_grad()
def sample_buffer(sampler: Sampler, classes: list[int], size: int, seed: int, node: str,
                  device: str = "cpu", truncation: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    chunks = math.ceil(size / CHUNK)
    labels = interleaved_labels(classes, chunks * CHUNK)
    images = []
    for k in range(chunks):
        made = sampler.sample(labels[k * CHUNK:(k + 1) * CHUNK].to(device), torch_stream(seed, node, "buffer", k),
                              truncation)
        if not made.isfinite().all():  # uint8 would turn NaN into black images that federate trains on
            raise UserError(f"node {node}'s generator makes non-finite images (its training diverged); re-run "
                            "fedcli train-gan --overwrite with a lower --lr")
        images.append(to_uint8(made).cpu())
    return torch.cat(images)[:size], labels[:size]


def buffer_metadata(node: str, manifest_hash: str, decoded: bool = False) -> dict[str, str]:
    return {"node": node, "manifest": manifest_hash, "layout": LAYOUT} | ({"decoded": DECODED} if decoded else {})


def load_buffer_file(folder: Path, node: str, manifest, saved: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """Node `node`'s buffer from its GAN folder: as its config.json (`saved`) recorded it (hash and number of
    images), made for this node and this partition (`manifest`), uint8 images of the partition's shape, one
    label per image from the node's classes."""
    what, fix = f"buffer of node {node}", f"re-run fedcli train-gan --node {node} --overwrite"
    path = Path(folder) / BUFFER
    tensors, _ = load_recorded(path, what, fix, expect={"node": node, "manifest": manifest.content_hash})
    images, labels = tensors.get("images"), tensors.get("labels")
    shape = (manifest["channels"], manifest["image_size"], manifest["image_size"])
    problem = buffer_problem(images, labels, shape, manifest.num_classes, saved.get("classes"))
    recorded = (saved.get("buffer") or {}).get("size")
    if not problem and (not len(labels) or len(labels) != recorded):
        problem = f"holds {len(labels)} images, but its config.json recorded {recorded!r}"
    if problem:
        raise UserError(f"{what} at {path} {problem}; {fix}")
    return images, labels
