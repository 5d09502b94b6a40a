"""Simulated scanners for the `site-shift` scheme: a fixed acquisition transform per node.

Node i gets the i-th scanner of the list (by default ACQUISITIONS, in this order; `--scanners` names another
list from it), cycling, so the nodes differ in feature space (appearance) the way images from different
hospitals' scanners do, while their label mix stays i.i.d.:

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
import torch.nn.functional as F

from fedcli.core.rng import numpy_stream

ACQUISITIONS: list[dict] = [
    {"name": "gamma", "gamma": 0.5},
    {"name": "blur", "sigma": 0.04},
    {"name": "invert"},
    {"name": "noise", "std": 0.15},
    {"name": "contrast", "scale": 0.5},
    {"name": "gamma", "gamma": 2.0},
]


def name_of(spec: dict) -> str:
    """The scanner's name for --scanners: its transform, with its parameter where two share one (gamma0.5)."""
    return spec["name"] + (f"{spec['gamma']:g}" if spec["name"] == "gamma" else "")


NAMES = [name_of(spec) for spec in ACQUISITIONS]


def for_node(index: int, scanners: tuple[str, ...] = ()) -> dict:
    """Scanner `index` (cycling) of `scanners`, names from NAMES, or of ACQUISITIONS when none are named."""
    chosen = [ACQUISITIONS[NAMES.index(name)] for name in scanners] or ACQUISITIONS
    return dict(chosen[index % len(chosen)])


def describe(spec: dict | None) -> str:
    if not spec:
        return "-"
    return " ".join(str(v) for v in spec.values())


def gaussian_blur(images: torch.Tensor, sigma: float) -> torch.Tensor:
    """Separable Gaussian blur with a reflected border, kernel radius 3 sigma."""
    radius = max(1, int(np.ceil(3 * sigma)))
    offsets = torch.arange(-radius, radius + 1, dtype=images.dtype)
    kernel = torch.exp(-0.5 * (offsets / sigma) ** 2)
    kernel = kernel / kernel.sum()
    n, c, h, w = images.shape
    x = F.pad(images.reshape(n * c, 1, h, w), (radius, radius, radius, radius), mode="reflect")
    x = F.conv2d(F.conv2d(x, kernel.view(1, 1, 1, -1)), kernel.view(1, 1, -1, 1))
    return x.reshape(n, c, h, w)


def apply(images: torch.Tensor, spec: dict, ids: list[str], seed: int, node: str) -> torch.Tensor:
    """Transform float images in [0, 1] of shape (N, C, H, W); the result stays in [0, 1]."""
    name = spec["name"]
    if name == "gamma":
        out = images.clamp(0, 1) ** spec["gamma"]
    elif name == "blur":
        out = gaussian_blur(images, spec["sigma"] * images.shape[-1])
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
