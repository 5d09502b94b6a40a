"""Decoding manifest records into uint8 image tensors (N, C, S, S) at the manifest's size.

Built-in and array sources are indexed; files are decoded in threads (PIL releases the GIL).
The node's simulated scanner, if any, is applied here, so every stage sees the same pixels.
"""

from __future__ import annotations

import functools
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from fedcli.core.errors import UserError
from fedcli.data import acquisition
from fedcli.data.imagefiles import decode_image
from fedcli.data.manifest import Manifest

CHUNK = 512  # images converted per step, so float copies stay small at large sizes


@functools.lru_cache(maxsize=1)
def digit_images() -> np.ndarray:
    from fedcli.data.sources.digits import load_digit_images

    return load_digit_images()[0]


@functools.lru_cache(maxsize=2)
def npz_images(path: str) -> np.ndarray:
    from fedcli.data.sources.medmnist import load_arrays

    if not Path(path).is_file():
        raise UserError(f"{path} (the partition's data file) is missing; restore it or re-run fedcli partition")
    return load_arrays(Path(path))[0]


def to_channels(images: torch.Tensor, channels: int) -> torch.Tensor:
    if images.shape[1] == channels:
        return images
    if channels == 3:
        return images.expand(-1, 3, -1, -1)
    weights = torch.tensor([0.299, 0.587, 0.114], dtype=images.dtype).view(1, 3, 1, 1)
    return (images * weights).sum(dim=1, keepdim=True)


def resize(images: torch.Tensor, size: int) -> torch.Tensor:
    if images.shape[-1] == size and images.shape[-2] == size:
        return images
    return F.interpolate(images, size=(size, size), mode="bilinear", align_corners=False,
                         antialias=images.shape[-1] > size).clamp(0, 1)


def decode_chunk(manifest: Manifest, records: list[dict]) -> torch.Tensor:
    """Float images in [0, 1], (n, C, S, S), before any scanner transform."""
    size, channels, source = manifest["image_size"], manifest["channels"], manifest["source"]
    if source == "digits":
        raw = torch.from_numpy(rows(digit_images(), records, manifest, "the built-in digits")).unsqueeze(1)
    elif source == "medmnist":
        array = rows(npz_images(str(manifest.root / manifest["data_file"])), records, manifest,
                     manifest["data_file"])
        raw = torch.from_numpy(array).float().div(255)
        raw = raw.unsqueeze(1) if raw.ndim == 3 else raw.permute(0, 3, 1, 2)
    else:
        root, scale, preprocess = manifest.root, manifest.scale, manifest.data.get("preprocess", "none")
        with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
            arrays = list(pool.map(lambda r: decode_image(root / r["path"], size, channels, scale, preprocess),
                                   records))
        return torch.from_numpy(np.stack(arrays)).float().div(255)
    return to_channels(resize(raw, size), channels)


def rows(array: np.ndarray, records: list[dict], manifest: Manifest, what: str) -> np.ndarray:
    """The records' rows of a source's array; an index past its end is refused, not an IndexError."""
    index = [r["index"] for r in records]
    beyond = next((r for r, i in zip(records, index) if i >= len(array)), None)
    if beyond is not None:
        raise UserError(f"{manifest.path}: record {beyond['id']!r} has index {beyond['index']}, but {what} holds "
                        f"{len(array)} images; re-run fedcli partition")
    return array[index]


def load_images(manifest: Manifest, node: str | None, records: list[dict]) -> torch.Tensor:
    """uint8 images (N, C, S, S) of a node's records, its scanner transform applied; `node` None: records of no
    node (the global test set), as the data holds them."""
    size, channels = manifest["image_size"], manifest["channels"]
    spec = manifest.node(node).get("acquisition") if node is not None else None
    out = torch.empty((len(records), channels, size, size), dtype=torch.uint8)
    for start in range(0, len(records), CHUNK):
        chunk = records[start:start + CHUNK]
        images = decode_chunk(manifest, chunk)
        for origin, index in origins(chunk, node).items():  # a held-apart image keeps its own node's scanner
            scanner = chunk[index[0]].get("acquisition") if origin != node else spec
            if scanner:
                images[index] = acquisition.apply(images[index], scanner, [chunk[i]["id"] for i in index],
                                                  manifest["seed"], origin)
        out[start:start + len(chunk)] = images.mul(255).round_().clamp_(0, 255).to(torch.uint8)
    return out


def origins(records: list[dict], node: str) -> dict[str, list[int]]:
    """Record positions by the node each image comes from (`origin`, set on a held-apart image; else `node`)."""
    grouped: dict[str, list[int]] = {}
    for i, record in enumerate(records):
        grouped.setdefault(record.get("origin", node), []).append(i)
    return grouped
