"""The torch Dataset every later stage trains and evaluates on.

A node's split is decoded once into a uint8 tensor cache (in memory, and optionally on disk as
safetensors keyed by the manifest's content hash), so epochs after the first cost only indexing.
Items are float images in [-1, 1], the range the GAN, LPIPS and the classifiers share.
Augmentation runs on whole batches of tensors with a generator the caller keys, so it is
reproducible wherever the batch is drawn.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import torch

from fedcli.data.loading import load_images
from fedcli.data.manifest import Manifest
from fedcli.experiment.artifacts import canonical_json, load_tensors, save_tensors, sha256_bytes


def to_float(images: torch.Tensor) -> torch.Tensor:
    """uint8 [0, 255] -> float [-1, 1]."""
    return images.float().div_(127.5).sub_(1.0)


def augment_batch(images: torch.Tensor, ops: tuple[str, ...], generator: torch.Generator) -> torch.Tensor:
    """Random horizontal flips (`hflip`) and 90-degree rotations (`rot90`), one draw per image."""
    n = images.shape[0]
    if "hflip" in ops:
        flip = torch.rand(n, generator=generator) < 0.5
        images = torch.where(flip.view(-1, 1, 1, 1), images.flip(-1), images)
    if "rot90" in ops:
        turns = torch.randint(0, 4, (n,), generator=generator)
        images = images.clone()
        for k in (1, 2, 3):
            chosen = turns == k
            if chosen.any():
                images[chosen] = torch.rot90(images[chosen], k, dims=(-2, -1))
    return images


UNSEEN = -1  # the label of an unlabelled image (few labels: data/label_parts.py)


class NodeDataset(torch.utils.data.Dataset):
    """One node's train (optionally only some folds) or test split, or another of the manifest's parts."""

    def __init__(self, manifest: Manifest, node: str, split: str = "train", folds: list[int] | None = None,
                 cache_dir: Path | None = None):
        self.node = node
        self.split = split
        self.records = manifest.records(node, split, folds)
        self.augment_ops = tuple(manifest.data.get("augment", ()))
        self.labels = torch.tensor([UNSEEN if r["label"] is None else r["label"] for r in self.records],
                                   dtype=torch.int64)
        self.images = self._cached(manifest, folds, cache_dir)

    def _cached(self, manifest: Manifest, folds: list[int] | None, cache_dir: Path | None) -> torch.Tensor:
        if cache_dir is None:
            return load_images(manifest, self.node, self.records)
        key = canonical_json([manifest.content_hash, self.node, self.split, folds]).encode()
        path = Path(cache_dir) / f"{sha256_bytes(key)[7:23]}.safetensors"
        if path.is_file():
            cached = load_tensors(path, "image cache")
            if cached.get("labels") is not None and torch.equal(cached["labels"], self.labels):
                return cached["images"]
        images = load_images(manifest, self.node, self.records)
        save_tensors(path, {"images": images, "labels": self.labels})
        return images

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return to_float(self.images[index]), int(self.labels[index])

    def batches(self, batch_size: int, generator: torch.Generator | None = None, augment: bool = False,
                drop_last: bool = False) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Mini-batches of (float images, labels); shuffled when a generator is given."""
        if augment and generator is None:
            raise ValueError("augmentation needs a generator")
        n = len(self)
        order = torch.randperm(n, generator=generator) if generator is not None else torch.arange(n)
        for start in range(0, n, batch_size):
            index = order[start:start + batch_size]
            if drop_last and len(index) < batch_size:
                break
            images = to_float(self.images[index])
            if augment and self.augment_ops:
                images = augment_batch(images, self.augment_ops, generator)
            yield images, self.labels[index]
