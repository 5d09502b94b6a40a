"""GAN throughput: fedcli's training step and buffer sampling against bare PyTorch loops.

The bare loop does the same forward/backward work on the same networks (D step with lazy R1,
G step, EMA update) without fedcli's trainer: no ADA controller, no keyed streams, no metrics.
The ratio (fedcli time / bare time) is the trainer's overhead; target <= 1.15.

`--fidelity` adds quality per unit of CPU: node0's phase-1 GAN on digits (16 px, the quickstart
partition) and, when ../shared/data has it, PneumoniaMNIST (32 px) is trained with the settings
before issue 13 (R1 gamma 0.05, ADA 20 kimg, EMA 2 kimg, no style mixing, no truncation; the ADA
transform set is today's) and after it (the defaults), and the buffer's fidelity ratio is printed
against the minutes of training. Minutes: 2 threads, about 5 per dataset.

`--compile` times fedcli's step compiled (--compile: torch.compile of D's forward and the synthesis network)
against eager at the quickstart's 16 px and at 64 px: the compilation (the first steps), then steady steps in
alternation, eager and compiled, median of the blocks; and whether two compiled runs from one seed give equal
losses (compiled kernels are deterministic on CPU once compiled, or the option could not be fingerprinted).
Run: .venv/bin/python bench/gan_throughput.py [--fidelity] [--compile]
"""

from __future__ import annotations

import copy
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F

from fedcli.generators import losses
from fedcli.generators.buffer import sample_buffer
from fedcli.generators.fid import FeatureSpace
from fedcli.generators.perceptual import Perceptual
from fedcli.generators.stylegan2.networks import Architecture, Generator
from fedcli.generators.stylegan2.train import GanTrainer, TrainSettings

STEPS = 20
# FID is not timed here; the trainer only needs a feature space for its real statistics
PIXELS = FeatureSpace(lambda images: F.avg_pool2d(images, 4).flatten(1), "pixels", False)


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
    settings = TrainSettings(ada_target=1.0, style_mixing=0.0)  # p stays 0, one w: both sides do the same work
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


def bench_compile(resolution: int, channel_base: int, channel_max: int, perceptual, blocks: int = 5) -> None:
    arch = Architecture(resolution=resolution, channels=1, num_classes=10, channel_base=channel_base,
                        channel_max=channel_max)
    reals = torch.rand(256, 1, resolution, resolution) * 2 - 1
    labels = torch.arange(256) % 10

    def trainer(compiled: bool) -> GanTrainer:
        settings = TrainSettings(compile=compiled)
        return GanTrainer(arch, settings, reals, labels, perceptual, PIXELS, torch.Generator().manual_seed(0), 1)

    eager, compiled, again = trainer(False), trainer(True), trainer(True)
    t_first = timed(lambda: [compiled.step() for _ in range(3)])
    [eager.step() for _ in range(3)]
    times = {"eager": [], "compiled": []}
    for _ in range(blocks):
        times["eager"].append(timed(lambda: [eager.step() for _ in range(STEPS)]) / STEPS)
        times["compiled"].append(timed(lambda: [compiled.step() for _ in range(STEPS)]) / STEPS)
    median = {k: sorted(v)[len(v) // 2] for k, v in times.items()}
    runs = [[t.step() for _ in range(5)] for t in (trainer(True), again)]
    stable = runs[0] == runs[1]
    print(f"compile {resolution}x{resolution}: eager {median['eager'] * 1000:7.1f} ms/step, compiled "
          f"{median['compiled'] * 1000:7.1f} ms/step, speed-up {median['eager'] / median['compiled']:.2f}x "
          f"(median of {blocks} blocks of {STEPS}); first 3 compiled steps {t_first:.1f} s; two compiled runs "
          f"{'equal' if stable else 'DIFFER'}", flush=True)


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


BEFORE = {"r1_gamma": 0.05, "ada_kimg": 20.0, "ema_kimg": 2.0, "style_mixing": 0.0, "truncation": 1.0}
PNEUMONIA = Path(__file__).resolve().parents[1] / "../shared/data/medmnist/pneumoniamnist.npz"


def bench_fidelity(source: list[str], iterations: int, every: int) -> None:
    """Fidelity ratio of node0's phase-1 EMA generator against training minutes, before and after."""
    from typer.testing import CliRunner

    from fedcli.cli import app
    from fedcli.generators.config import GanConfig
    from fedcli.data.dataset import NodeDataset, to_float
    from fedcli.data.manifest import Manifest
    from fedcli.data.tensor_source import TensorSource
    from fedcli.generators import fidelity
    from fedcli.generators.stylegan2.kind import architecture, settings
    from fedcli.core.rng import stream_seed

    with tempfile.TemporaryDirectory() as tmp:
        exp = Path(tmp) / "exp"
        result = CliRunner().invoke(app, ["partition", *source, "--scheme", "site-shift", "--nodes", "3", "--exp",
                                          str(exp), "--threads", "2"])
        assert result.exit_code == 0, result.output
        manifest = Manifest.load(exp)
        train, test = NodeDataset(manifest, "node0", "train"), NodeDataset(manifest, "node0", "test")
        real, tests = TensorSource(train.images, train.labels), TensorSource(test.images, test.labels)
        classes = sorted(set(train.labels.tolist()))
        budget = fidelity.Budget(epochs=9)
        perceptual = Perceptual("alex")
        for name, values in (("before", BEFORE), ("after", {})):
            cfg = GanConfig(exp=exp, iterations=iterations, **values)
            arch = architecture(cfg, manifest)
            stream = torch.Generator().manual_seed(stream_seed(0, "node0", "train-gan"))
            trainer = GanTrainer(arch, settings(cfg, arch.resolution), to_float(train.images), train.labels,
                                 perceptual, PIXELS, stream, stream_seed(0, "node0", "gan-init"))
            seconds = 0.0
            for i in range(1, iterations + 1):
                seconds += timed(trainer.step)
                if i % every == 0:
                    G = Generator(arch)
                    G.load_state_dict(trainer.G_ema.state_dict())
                    buffer = TensorSource(*sample_buffer(G.eval(), classes, 512, 0, "node0",
                                                         truncation=cfg.truncation))
                    score = fidelity.score({"b": buffer}, real, tests, budget, in_channels=manifest["channels"],
                                           num_classes=manifest.num_classes, seed=0, node="node0")["b"]
                    print(f"{source[1]} {arch.resolution} px {name:6s} iteration {i:4d}: {seconds / 60:5.2f} min, "
                          f"fidelity ratio {score['ratio']:.3f} ({score['ratio'] / (seconds / 60):.3f} per minute)",
                          flush=True)


def main() -> None:
    warnings.simplefilter("ignore")
    torch.set_num_threads(2)
    perceptual = Perceptual("alex")
    print(f"{STEPS} iterations each, batch 32, 2 threads, {torch.__version__}, "
          f"device cpu")
    if "--compile" in sys.argv:
        bench_compile(16, 512, 64, perceptual)  # the quickstart
        bench_compile(64, 1024, 64, perceptual)
        return
    bench_training(32, 512, 64, perceptual, PIXELS)  # the quick configuration
    bench_training(16, 512, 64, perceptual, PIXELS)  # the quickstart
    bench_training(64, 1024, 64, perceptual, PIXELS)
    bench_sampling(perceptual)
    if "--fidelity" in sys.argv:
        bench_fidelity(["--source", "digits", "--image-size", "16"], 300, 100)
        if PNEUMONIA.is_file():
            bench_fidelity(["--source", "medmnist", "--data-dir", str(PNEUMONIA), "--image-size", "32"], 400, 100)


if __name__ == "__main__":
    main()
