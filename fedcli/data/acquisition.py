"""Simulated scanners for the `site-shift` scheme: a fixed acquisition transform per node.

Node i gets ACQUISITIONS[i % 6], so the nodes differ in feature space (appearance) the way
images from different hospitals' scanners do, while their label mix stays i.i.d.:

  0 gamma 0.5     over-exposed detector: dark values lifted (x ** 0.5)
  1 blur          soft, low-resolution detector: Gaussian blur, sigma = 4% of the image side
  2 invert        inverted display convention (as DICOM MONOCHROME1): 1 - x
  3 noise         noisy sensor: additive Gaussian noise, std 0.15, fixed per image
  4 contrast      narrow dynamic range around mid-grey: 0.5 + 0.5 (x - 0.5)
  5 gamma 2.0     under-exposed detector: bright values pulled down (x ** 2)
"""

from __future__ import annotations

import numpy as np
import torch

from fedcli.rng import numpy_stream

ACQUISITIONS: list[dict] = [
    {"name": "gamma", "gamma": 0.5},
    {"name": "blur", "sigma": 0.04},
    {"name": "invert"},
    {"name": "noise", "std": 0.15},
    {"name": "contrast", "scale": 0.5},
    {"name": "gamma", "gamma": 2.0},
]


def for_node(index: int) -> dict:
    return dict(ACQUISITIONS[index % len(ACQUISITIONS)])


def describe(spec: dict | None) -> str:
    if not spec:
        return "-"
    return " ".join(str(v) for v in spec.values())


def apply(images: torch.Tensor, spec: dict, ids: list[str], seed: int, node: str) -> torch.Tensor:
    """Transform float images in [0, 1] of shape (N, C, H, W); the result stays in [0, 1]."""
    from torchvision.transforms.functional import gaussian_blur

    name = spec["name"]
    if name == "gamma":
        out = images.clamp(0, 1) ** spec["gamma"]
    elif name == "blur":
        sigma = spec["sigma"] * images.shape[-1]
        radius = max(1, int(np.ceil(3 * sigma)))
        out = gaussian_blur(images, kernel_size=[2 * radius + 1] * 2, sigma=[sigma] * 2)
    elif name == "invert":
        out = 1.0 - images
    elif name == "noise":
        noise = np.stack([numpy_stream(seed, "acquisition-noise", node, i).standard_normal(images.shape[1:])
                          for i in ids]).astype(np.float32)
        out = images + spec["std"] * torch.from_numpy(noise)
    elif name == "contrast":
        out = 0.5 + spec["scale"] * (images - 0.5)
    else:
        raise ValueError(f"unknown acquisition transform {name!r}")
    return out.clamp(0, 1)
