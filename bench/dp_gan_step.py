"""The cost of differential privacy in a GAN step: fedcli's trainer at the quickstart's size (digits nodes
of 479 images at 16 px, batch 32), timed per iteration (one D step and one G step) without DP, with
DP-SGD and R1 off (--r1-gamma 0), and with DP-SGD and per-image R1 (the default: R1's double backward
runs per image under vmap, inside the clipped gradient). Also the R1 step alone, DP against not.
Prints seconds per iteration and the ratios, all measured in this one run.
Run: .venv/bin/python bench/dp_gan_step.py [--threads 2]
"""

from __future__ import annotations

import argparse
import time
import warnings

import torch
import torch.nn.functional as F

from fedcli.generators import private
from fedcli.generators.fid import FeatureSpace
from fedcli.generators.perceptual import Perceptual
from fedcli.generators.stylegan2.networks import Architecture
from fedcli.generators.stylegan2.train import GanTrainer, TrainSettings

IMAGES, BATCH, STEPS = 479, 32, 24  # r1_every = 4: 6 R1 steps in 24
ARCH = Architecture(resolution=16, channels=1, num_classes=10, z_dim=64, w_dim=64, channel_base=512, channel_max=64)
PIXELS = FeatureSpace(lambda images: F.avg_pool2d(images, 4).flatten(1), "pixels", False)


def trainer(dp: private.DpPlan | None, r1_gamma: float) -> GanTrainer:
    generator = torch.Generator().manual_seed(0)
    images = torch.rand(IMAGES, 1, 16, 16, generator=generator) * 2 - 1
    labels = torch.arange(IMAGES) % 10
    settings = TrainSettings(batch=BATCH, r1_gamma=r1_gamma, fid_images=64)
    return GanTrainer(ARCH, settings, images, labels, Perceptual("alex"), PIXELS, generator, init_seed=1, dp=dp,
                      noise=torch.Generator().manual_seed(2))


def seconds_per_step(t: GanTrainer, steps: int, only_r1: bool = False) -> float:
    t.step()  # warm-up
    elapsed, counted = 0.0, 0
    for _ in range(steps):
        timed = not only_r1 or t.iteration % t.s.r1_every == 0
        start = time.perf_counter()
        t.step()
        if timed:
            elapsed, counted = elapsed + time.perf_counter() - start, counted + 1
    return elapsed / counted


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=2)
    torch.set_num_threads(parser.parse_args().threads)
    warnings.filterwarnings("ignore")
    plan = private.plan(3.0, None, 1.0, BATCH, IMAGES, 300, "bench")
    r1 = 0.0002 * 16 ** 2 / BATCH  # the quickstart's auto R1 gamma
    rows = {"no DP (R1 auto)": seconds_per_step(trainer(None, r1), STEPS),
            "DP, R1 off": seconds_per_step(trainer(plan, 0.0), STEPS),
            "DP, per-image R1 (default)": seconds_per_step(trainer(plan, r1), STEPS),
            "R1 step, no DP": seconds_per_step(trainer(None, r1), STEPS, only_r1=True),
            "R1 step, DP": seconds_per_step(trainer(plan, r1), STEPS, only_r1=True)}
    base = rows["no DP (R1 auto)"]
    for name, value in rows.items():
        print(f"{name:28s} {value * 1000:8.1f} ms/iteration   x{value / base:5.2f} of no DP")
    print(f"per-image R1 step / DP step without R1: x{rows['R1 step, DP'] / rows['DP, R1 off']:.1f}")


if __name__ == "__main__":
    main()
