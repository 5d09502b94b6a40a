"""`samples.png`: a grid per class from each of a node's generators (released, standard, control); with
`--tensorboard` the same grids in the node's TensorBoard run (fedcli/experiment/events.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from fedcli.core.rng import torch_stream
from fedcli.experiment import events
from fedcli.experiment.plotting import pyplot, save_figure
from fedcli.generators.buffer import to_uint8
from fedcli.generators.protocol import Sampler

PER_CLASS = 8


@torch.no_grad()
def class_grid(generator: Sampler, classes: list[int], seed: int, node: str, device: str,
               truncation: float = 1.0) -> np.ndarray:
    stream = torch_stream(seed, node, "samples")
    labels = torch.tensor(classes, dtype=torch.int64).repeat_interleave(PER_CLASS)
    images = to_uint8(generator.sample(labels.to(device), stream, truncation)).cpu().numpy()
    c, h, w = images.shape[1:]
    grid = images.reshape(len(classes), PER_CLASS, c, h, w).transpose(0, 3, 1, 4, 2)
    return grid.reshape(len(classes) * h, PER_CLASS * w, c)


def write_samples(path: Path, generators: dict[str, Sampler], titles: dict[str, str], classes: list[int],
                  label_names: list[str], seed: int, node: str, device: str, truncation: float = 1.0) -> None:
    """Every generator's samples, at the buffer's truncation, under its kind's title for its role; each grid also
    as TensorBoard's `samples/<role>`."""
    plt = pyplot()

    fig, axes = plt.subplots(1, len(generators), figsize=(5 * len(generators), 0.55 * len(classes) + 1), dpi=90,
                             squeeze=False)
    axes = axes[0]
    for axis, (name, generator) in zip(axes, generators.items()):
        grid = class_grid(generator, classes, seed, node, device, truncation)
        events.images(node, {f"samples/{name}": grid})
        axis.imshow(grid.squeeze(-1) if grid.shape[-1] == 1 else grid, cmap="gray", vmin=0, vmax=255)
        size = grid.shape[0] // len(classes)
        axis.set_yticks([size * (i + 0.5) for i in range(len(classes))], [label_names[c] for c in classes],
                        fontsize=7)
        axis.set_xticks([])
        axis.set_title(f"{node}: {titles[name]}", fontsize=9)
    fig.tight_layout()
    save_figure(fig, path)
