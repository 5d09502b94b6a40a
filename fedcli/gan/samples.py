"""`samples.png`: a grid per class from the standard (phase 1) and privacy-preserving (phase 2) GANs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from fedcli.gan.buffer import to_uint8
from fedcli.rng import torch_stream

PER_CLASS = 8


@torch.no_grad()
def class_grid(generator, classes: list[int], seed: int, node: str, device: str, truncation: float = 1.0) -> np.ndarray:
    stream = torch_stream(seed, node, "samples")
    labels = torch.tensor(classes, dtype=torch.int64).repeat_interleave(PER_CLASS)
    z = torch.randn(len(labels), generator.arch.z_dim, generator=stream)
    images = to_uint8(generator(z.to(device), labels.to(device), generator=stream, truncation=truncation)).cpu().numpy()
    c, h, w = images.shape[1:]
    grid = images.reshape(len(classes), PER_CLASS, c, h, w).transpose(0, 3, 1, 4, 2)
    return grid.reshape(len(classes) * h, PER_CLASS * w, c)


def write_samples(path: Path, generators: dict, classes: list[int], label_names: list[str], seed: int, node: str,
                  device: str, truncation: float = 1.0) -> None:
    """Every generator's samples (standard, privacy-preserving, control), at the buffer's truncation."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    titles = {"phase1": "standard GAN (phase 1)", "phase2": "privacy-preserving GAN (phase 2, buffer)",
              "control": "control (phase 2 at alpha 0)"}
    fig, axes = plt.subplots(1, len(generators), figsize=(5 * len(generators), 0.55 * len(classes) + 1), dpi=90,
                             squeeze=False)
    axes = axes[0]
    for axis, (name, generator) in zip(axes, generators.items()):
        grid = class_grid(generator, classes, seed, node, device, truncation)
        axis.imshow(grid.squeeze(-1) if grid.shape[-1] == 1 else grid, cmap="gray", vmin=0, vmax=255)
        size = grid.shape[0] // len(classes)
        axis.set_yticks([size * (i + 0.5) for i in range(len(classes))], [label_names[c] for c in classes],
                        fontsize=7)
        axis.set_xticks([])
        axis.set_title(f"{node}: {titles[name]}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
