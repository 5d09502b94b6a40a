"""Batched latent projection against projecting the same images one at a time.

Both project the same 32 digits images with the same generator, starting w and number of steps;
the batched run optimises all 32 w at once. Prints images per second of both, the ratio (target
>= 5x on a 2-core CPU) and the final mean LPIPS of both (must agree within 5%).

Then the audit's projection cost per node at the quickstart's settings (16 px generator, 120 members +
120 non-members, 80 steps, two generators: control and privacy; a third with --standard) for batch
sizes 40, 120 and 240, whose results are the same (an image's projection does not depend on its batch).
Run: .venv/bin/python bench/projection_throughput.py
"""

from __future__ import annotations

import time
import warnings

import torch
import torch.nn.functional as F

from fedcli.audit.projection import ProjectionSettings, project
from fedcli.data.sources.digits import load_digit_images
from fedcli.generators.perceptual import Perceptual
from fedcli.generators.stylegan2.networks import Architecture, Generator, class_mean_w

STEPS = 100
IMAGES = 32


def streams(keys) -> list[torch.Generator]:
    """Image i's stream, whichever batch it is projected in."""
    return [torch.Generator().manual_seed(k) for k in keys]


def main() -> None:
    warnings.simplefilter("ignore")
    torch.set_num_threads(2)
    torch.manual_seed(0)
    arch = Architecture(resolution=32, channels=1, num_classes=10, channel_base=512, channel_max=64)
    generator = Generator(arch).requires_grad_(False)
    perceptual = Perceptual("alex")
    images, labels = load_digit_images()
    targets = F.interpolate(torch.from_numpy(images[:IMAGES]).unsqueeze(1), size=32, mode="bilinear") * 2 - 1
    classes = torch.from_numpy(labels[:IMAGES])
    means, spread = class_mean_w(generator, generator.arch.z_dim, list(range(10)), 1000, torch.Generator().manual_seed(1))
    w_start = torch.stack([means[int(c)] for c in classes])
    settings = ProjectionSettings(steps=STEPS)

    def synthesis(w):
        return generator.synthesis(w, noise_mode="const")

    start = time.perf_counter()
    batched = project(synthesis, targets, w_start, perceptual, settings, streams(range(IMAGES)), spread)
    t_batched = time.perf_counter() - start
    start = time.perf_counter()
    single = torch.cat([project(synthesis, targets[i:i + 1], w_start[i:i + 1], perceptual, settings,
                                streams([i]), spread).lpips for i in range(IMAGES)])
    t_single = time.perf_counter() - start
    print(f"{IMAGES} digits images, {STEPS} steps each, 32x32 generator (quick config), LPIPS {perceptual.name}, "
          "2 threads")
    print(f"one at a time: {IMAGES / t_single:6.2f} img/s, mean LPIPS {single.mean():.5f}")
    print(f"batch of {IMAGES}:   {IMAGES / t_batched:6.2f} img/s, mean LPIPS {batched.lpips.mean():.5f}")
    print(f"speed-up {t_single / t_batched:.1f}x; LPIPS difference "
          f"{abs(batched.lpips.mean() - single.mean()) / single.mean() * 100:.1f}%")

    audit_cost_per_node(perceptual)


def audit_cost_per_node(perceptual) -> None:
    arch = Architecture(resolution=16, channels=1, num_classes=10, channel_base=512, channel_max=64)
    generator = Generator(arch).requires_grad_(False).to(memory_format=torch.channels_last)  # as the audit runs
    perceptual = perceptual.to(memory_format=torch.channels_last)
    images, labels = load_digit_images()
    targets = F.interpolate(torch.from_numpy(images[:240]).unsqueeze(1), size=16, mode="bilinear") * 2 - 1
    means, spread = class_mean_w(generator, generator.arch.z_dim, list(range(10)), 1000, torch.Generator().manual_seed(1))
    w_start = torch.stack([means[int(c)] for c in labels[:240]])
    settings = ProjectionSettings(steps=80)
    for batch in (40, 120, 240):
        start = time.perf_counter()
        for i in range(0, 240, batch):
            project(lambda w: generator.synthesis(w, noise_mode="const"), targets[i:i + batch], w_start[i:i + batch],
                    perceptual, settings, streams(range(i, min(i + batch, 240))), spread)
        seconds = time.perf_counter() - start
        print(f"audit projections per node (quickstart: 16 px, 240 images, 80 steps), batch {batch}: "
              f"{2 * seconds:.1f} s for the control and privacy generators, {3 * seconds:.1f} s with --standard")


if __name__ == "__main__":
    main()
