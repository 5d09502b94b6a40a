"""The VQ-VAE-2 kind against bare PyTorch loops of the same networks, in one run.

1. Training: fedcli's `train_vqvae` (keyed batches, EMA codebooks with dead-code restarts, the per-step log of
   losses, perplexities and restarts) against a bare loop over the same network from the same initial weights
   (the same batches from a plain permutation, the same loss and Adam, the codebooks' EMA update without
   restarts and no log). 32 px, the kind's defaults (64 feature maps, codebooks of 64 x 32), batch 32, 60 steps.
2. Sampling: `VqGenerator.sample` (both priors position by position from a keyed stream, then the decoder)
   against a bare loop over the same priors and decoder (softmax and torch.multinomial on the same device, no
   keyed stream), 64 images of two classes, priors of 64 channels and 4 layers.
3. The cost of DP (train-gan --dp-epsilon): `train_vqvae_private` (gradient codebooks, Poisson batches of expected
   size 32, each image's gradient by torch.func, Opacus's clipping and noise) against `train_vqvae`, 60 steps; and
   `train_prior_private` against `train_prior`, 60 steps of both priors on 640 code maps. Here the ratio is the price
   of DP-SGD (per-example gradients materialised: the priors hold 1.15M parameters, the VQ-VAE-2 0.43M), and for
   the VQ-VAE-2 also of its gradient codebooks against EMA ones (what DP needs, timed as train-gan runs it); not an
   overhead goal.
One thread; best of 3; ratio = fedcli / bare (goal: at most 1.10).
Run: .venv/bin/python bench/vqvae2_step.py
"""

from __future__ import annotations

import copy
import dataclasses
import math
import time
import warnings

import torch
import torch.nn.functional as F

from fedcli.core.rng import torch_stream
from fedcli.generators import private
from fedcli.generators.config import GanConfig
from fedcli.generators.vqvae2.codes import NodeCodes
from fedcli.generators.vqvae2.kind import (VqGenerator, train_prior, train_prior_private, train_vqvae,
                                           train_vqvae_private)
from fedcli.generators.vqvae2.networks import VqArchitecture, VqVae2, loss
from fedcli.generators.vqvae2.prior import PriorArchitecture

REPEATS = 3
STEPS = 60


def best_of(fn) -> float:
    times = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def training() -> tuple[float, float]:
    arch = VqArchitecture(resolution=32, channels=1, num_classes=2)
    torch.manual_seed(0)
    initial = VqVae2(arch)
    images = torch.rand(640, 1, 32, 32, generator=torch.Generator().manual_seed(0)) * 2 - 1
    cfg = GanConfig(exp=".", generator="vqvae2", iterations=STEPS, batch=32)

    def ours():
        train_vqvae(copy.deepcopy(initial), images, cfg, torch_stream(0, "bench"), "cpu", lambda row: None)

    def bare():
        model = copy.deepcopy(initial).train()
        optimizer = torch.optim.Adam(model.parameters(), lr=cfg.vq_lr)
        order = torch.randperm(len(images), generator=torch.Generator().manual_seed(0))
        for step in range(STEPS):
            start = step * 32 % len(images)
            total, _, _ = loss(model, images[order[start:start + 32]], cfg.vq_beta)
            optimizer.zero_grad(set_to_none=True)
            total.backward()
            optimizer.step()

    return best_of(ours), best_of(bare)


def sampling() -> tuple[float, float]:
    arch = VqArchitecture(resolution=32, channels=1, num_classes=2)
    torch.manual_seed(0)
    generator = VqGenerator(arch, PriorArchitecture(codes=arch.codes, num_classes=2)).eval()
    labels = torch.arange(64) % 2

    def ours():
        generator.sample(labels, torch_stream(0, "bench-sample"))

    @torch.no_grad()
    def bare():
        def draw(prior, side, top=None):
            codes = torch.zeros(len(labels), side, side, dtype=torch.long)
            for i in range(side):
                for j in range(side):
                    codes[:, i, j] = torch.multinomial(F.softmax(prior(codes, labels, top)[:, :, i, j], 1), 1)[:, 0]
            return codes
        top = draw(generator.prior_top, arch.top_side)
        generator.vqvae.decode(top, draw(generator.prior_bottom, arch.bottom_side, top))

    return best_of(ours), best_of(bare)


def dp_cost() -> tuple[tuple[float, float], tuple[float, float]]:
    """(DP, non-DP) seconds of the VQ-VAE-2's training and of its priors' (sigma 1, C 1, q = 32 / 640)."""
    arch = VqArchitecture(resolution=32, channels=1, num_classes=2)
    images = torch.rand(640, 1, 32, 32, generator=torch.Generator().manual_seed(0)) * 2 - 1
    cfg = GanConfig(exp=".", generator="vqvae2", iterations=STEPS, batch=32, prior_iterations=STEPS)
    plan = private.DpPlan(math.nan, 1e-4, 1.0, 32 / 640, 2 * STEPS, 1.0, 640)  # sigma 1: no target to solve for
    torch.manual_seed(0)
    plain, gradient = VqVae2(arch), VqVae2(dataclasses.replace(arch, codebook="gradient"))
    generator = VqGenerator(arch, PriorArchitecture(codes=arch.codes, num_classes=2))
    top = torch.randint(arch.codes, (640, arch.top_side, arch.top_side), generator=torch.Generator().manual_seed(1))
    bottom = torch.randint(arch.codes, (640, arch.bottom_side, arch.bottom_side),
                           generator=torch.Generator().manual_seed(2))
    codes = NodeCodes(top, bottom, torch.arange(640) % 2)

    def vq_dp():
        train_vqvae_private(copy.deepcopy(gradient), images, cfg, plan, torch_stream(0, "bench"),
                            torch_stream(0, "bench-noise"), "cpu", lambda row: None)

    def vq_plain():
        train_vqvae(copy.deepcopy(plain), images, cfg, torch_stream(0, "bench"), "cpu", lambda row: None)

    def prior_dp():
        train_prior_private(copy.deepcopy(generator), codes, cfg, plan, torch_stream(0, "bench"),
                            torch_stream(0, "bench-noise"), "cpu", lambda row: None)

    def prior_plain():
        train_prior(copy.deepcopy(generator), codes, cfg, torch_stream(0, "bench"), "cpu", lambda row: None)

    return (best_of(vq_dp), best_of(vq_plain)), (best_of(prior_dp), best_of(prior_plain))


def main() -> None:
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", message="Optimal order")  # Opacus's accountant, not timed here
    for name, (ours, bare) in (("training", training()), ("sampling", sampling())):
        what = f"{STEPS} steps of batch 32" if name == "training" else "64 prior samples"
        print(f"{name:9s} {what}: fedcli {ours:.3f} s, bare PyTorch {bare:.3f} s, ratio {ours / bare:.2f}x")
    for name, (dp, plain) in zip(("VQ-VAE-2", "priors"), dp_cost()):
        print(f"DP {name:8s} {STEPS} steps of expected batch 32: DP-SGD {dp:.3f} s, without DP {plain:.3f} s, "
              f"ratio {dp / plain:.2f}x")


if __name__ == "__main__":
    main()
