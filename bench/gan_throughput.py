"""GAN throughput: fedcli's training step and buffer sampling against bare PyTorch loops.

The bare loop does the same forward/backward work on the same networks (D step with lazy R1,
G step, EMA update) without fedcli's trainer: no ADA controller, no keyed streams, no metrics.
The ratio (fedcli time / bare time) is the trainer's overhead; target <= 1.15.
Run: .venv/bin/python bench/gan_throughput.py
"""

from __future__ import annotations

import copy
import time
import warnings

import torch
import torch.nn.functional as F

from fedcli.gan import losses
from fedcli.gan.buffer import sample_buffer
from fedcli.gan.fid import FeatureSpace
from fedcli.gan.networks import Architecture, Generator
from fedcli.gan.perceptual import Perceptual
from fedcli.gan.train import GanTrainer, TrainSettings

STEPS = 20


def bare_loop(G, D, G_ema, reals, labels, settings, steps):
    opt_g = torch.optim.Adam(G.parameters(), lr=settings.lr, betas=(0.0, 0.99))
    opt_d = torch.optim.Adam(D.parameters(), lr=settings.lr, betas=(0.0, 0.99))
    b, z_dim = settings.batch, G.arch.z_dim
    for i in range(steps):
        index = torch.randint(0, len(reals), (b,))
        x, y = reals[index], labels[index]
        D.requires_grad_(True)
        with torch.no_grad():
            fakes = G(torch.randn(b, z_dim), y)
        fake_logits = D(fakes, y)
        if i % settings.r1_every == 0:
            r1, real_logits = losses.r1_penalty(D, x, y)
        else:
            r1, real_logits = torch.zeros(()), D(x, y)
        loss_d = F.softplus(fake_logits).mean() + F.softplus(-real_logits).mean() + settings.r1_gamma / 2 * r1 * 4
        opt_d.zero_grad(set_to_none=True)
        loss_d.backward()
        opt_d.step()
        D.requires_grad_(False)
        loss_g = F.softplus(-D(G(torch.randn(b, z_dim), y), y)).mean()
        opt_g.zero_grad(set_to_none=True)
        loss_g.backward()
        opt_g.step()
        with torch.no_grad():
            for pe, p in zip(G_ema.parameters(), G.parameters()):
                pe.lerp_(p, 0.01)


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def bench_training(resolution: int, channel_base: int, channel_max: int, perceptual, features) -> None:
    arch = Architecture(resolution=resolution, channels=1, num_classes=10, channel_base=channel_base,
                        channel_max=channel_max)
    settings = TrainSettings(ada_target=1.0)  # p stays 0: both sides do the same work
    reals = torch.rand(256, 1, resolution, resolution) * 2 - 1
    labels = torch.arange(256) % 10
    trainer = GanTrainer(arch, settings, reals, labels, perceptual, features, torch.Generator().manual_seed(0), 1)
    G, D = copy.deepcopy(trainer.G), copy.deepcopy(trainer.D)
    G_ema = copy.deepcopy(G)
    for _ in range(3):  # warm-up
        trainer.step()
    bare_loop(G, D, G_ema, reals, labels, settings, 3)
    t_bare = timed(lambda: bare_loop(G, D, G_ema, reals, labels, settings, STEPS))
    t_fedcli = timed(lambda: [trainer.step() for _ in range(STEPS)])
    print(f"train {resolution}x{resolution} widths {[arch.width(r) for r in [4, *arch.block_resolutions]]}: "
          f"bare {STEPS / t_bare:6.2f} it/s, fedcli {STEPS / t_fedcli:6.2f} it/s, ratio {t_fedcli / t_bare:.2f}")


def bench_sampling(perceptual) -> None:
    arch = Architecture(resolution=32, channels=1, num_classes=10, channel_base=512, channel_max=64)
    G = Generator(arch).eval()
    n = 512

    @torch.no_grad()
    def bare():
        for start in range(0, n, 64):
            images = G(torch.randn(64, arch.z_dim), torch.arange(start, start + 64) % 10)
            ((images.clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8)

    bare()
    t_bare = timed(bare)
    t_fedcli = timed(lambda: sample_buffer(G, list(range(10)), n, 0, "node0"))
    print(f"buffer sampling 32x32: bare {n / t_bare:8.0f} img/s, fedcli {n / t_fedcli:8.0f} img/s, "
          f"ratio {t_fedcli / t_bare:.2f}")


def main() -> None:
    warnings.simplefilter("ignore")
    torch.set_num_threads(2)
    perceptual = Perceptual("alex")
    features = FeatureSpace(perceptual)
    print(f"{STEPS} iterations each, batch 32, 2 threads, {torch.__version__}, "
          f"device cpu")
    bench_training(32, 512, 64, perceptual, features)  # the quick configuration
    bench_training(64, 1024, 64, perceptual, features)
    bench_sampling(perceptual)


if __name__ == "__main__":
    main()
