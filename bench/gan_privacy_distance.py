"""Nearest-real distance of samples from the standard (phase 1) and privacy-preserving (phase 2)
generators of a trained experiment, in LPIPS and in pixels, with the phase-2 / phase-1 ratio.

Both generators get the same latents and labels. Larger distances mean samples sit further from
every real training image (the effect the privacy loss is for).
Run after train-gan: .venv/bin/python bench/gan_privacy_distance.py results/demo
"""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

import torch

from fedcli.data.dataset import NodeDataset, to_float
from fedcli.data.manifest import Manifest
from fedcli.experiment.paths import GENERATOR, GENERATOR_PHASE1
from fedcli.generators.perceptual import Perceptual
from fedcli.generators.registry import load_generator
from fedcli.generators.stylegan2.networks import Architecture

SAMPLES = 512


@torch.no_grad()
def nearest(perceptual: Perceptual, fakes: torch.Tensor, reals: torch.Tensor) -> tuple[float, float]:
    real_features = perceptual.features(reals)
    lpips = torch.cat([perceptual.pairwise(perceptual.features(fakes[i:i + 128]), real_features).min(dim=1).values
                       for i in range(0, len(fakes), 128)])
    pixel = torch.cdist(fakes.flatten(1), reals.flatten(1)).min(dim=1).values / fakes[0].numel() ** 0.5
    return lpips.mean().item(), pixel.mean().item()


def main(exp: Path) -> None:
    warnings.simplefilter("ignore")
    manifest = Manifest.load(exp)
    print(f"{'node':<8} {'LPIPS p1':>9} {'LPIPS p2':>9} {'ratio':>6} {'pixel p1':>9} {'pixel p2':>9} {'ratio':>6}")
    for node in manifest.node_names:
        folder = exp / "gan" / node
        config = json.loads((folder / "config.json").read_text())
        perceptual = Perceptual(config["lpips"]["net"])
        arch = Architecture(**config["architecture"])
        reals = to_float(NodeDataset(manifest, node, "train").images)
        stream = torch.Generator().manual_seed(0)
        z = torch.randn(SAMPLES, arch.z_dim, generator=stream)
        labels = torch.tensor(config["classes"]).repeat(SAMPLES)[:SAMPLES]
        results = []
        for name in (GENERATOR_PHASE1, GENERATOR):
            generator = load_generator(folder, name, config)
            with torch.no_grad():
                fakes = generator(z, labels, noise_mode="const").clamp(-1, 1)
            results.append(nearest(perceptual, fakes, reals))
        (l1, p1), (l2, p2) = results
        print(f"{node:<8} {l1:>9.4f} {l2:>9.4f} {l2 / l1:>6.2f} {p1:>9.4f} {p2:>9.4f} {p2 / p1:>6.2f}")
    print(f"LPIPS network: {perceptual.name}; pixel distance: RMS per pixel on [-1, 1]")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
