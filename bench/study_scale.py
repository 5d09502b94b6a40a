"""Study scale: one training step of every network the studies' recipes train, at their full image size, on
synthetic tensors of the recipes' shapes, on the device present: peak memory, step time, and the recipe's
projected wall time (its step count times the step time).

Each measurement runs in a process of its own, so a peak is that step's: CUDA's `max_memory_allocated`, or on
CPU the process's peak RSS less its RSS before the networks were built. On CPU a study's batch does not fit this
24 GB, 2-core machine in minutes, so the step runs at a capped batch (CPU_BATCH, stated in the table) and its
time and activation memory are scaled linearly to the recipe's batch (the networks' and optimisers' memory is
not scaled). What is not counted: FID checks, evaluation, data loading, the fidelity score.

Step counts, per node and strategy, from the recipes and the studies' data (80% of each set trains):
- FedER GAN (recipes/tuberculosis.toml, retinopathy.toml): --iterations 100,000 phase-1 steps at most, then
  --pp-iterations 20,000 phase-2 steps and as many for the alpha-0 control.
- ResNet-18 (tuberculosis): R x E = 100 x 100 epochs over Shenzhen's 530 training images at batch 32 (17
  steps an epoch), the larger node.
- VQ-VAE-2 and its priors (retinopathy-replay.toml): --iterations 20,000 and --prior-iterations 20,000 at each
  of the 4 nodes.
- ResNet-34 (retinopathy): 100 rounds x 1 epoch over a node's 2,400 training images (75 steps).
- EfficientNet-B0 (skin-lesions-few-labels.toml): 200 rounds x --steps-per-round 100; under FixMatch a step
  reads 16 labelled and 16 unlabelled images twice (weak and strong), 48 images.
Run: .venv/bin/python bench/study_scale.py [--precision fp32,bf16] [--out FILE]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import resource
import subprocess
import sys
import time
import types

import torch
import torch.nn.functional as F

CPU_BATCH = 2  # images per step on CPU, scaled to the recipe's batch
CAP_S = 600.0  # seconds a measurement may take (--cap-s); a CPU without bf16 units emulates it, slowly
WARMUP, TIMED = 1, 1  # steps: one to warm up (allocation, oneDNN primitives), one timed


@dataclasses.dataclass(frozen=True)
class Component:
    name: str
    recipe: str
    size: int
    batch: int  # the recipe's images per step
    steps: int  # per node and strategy


COMPONENTS = [
    Component("stylegan2 phase 1", "tuberculosis, retinopathy", 256, 32, 100_000),
    Component("stylegan2 phase 2 (L_PP)", "tuberculosis, retinopathy", 256, 32, 40_000),
    Component("resnet18", "tuberculosis", 256, 32, 100 * 100 * 17),
    Component("vqvae2", "retinopathy-replay", 256, 32, 20_000),
    Component("vqvae2 prior", "retinopathy-replay", 256, 32, 20_000),
    Component("resnet34", "retinopathy", 256, 32, 100 * 75),
    Component("efficientnet_b0 fixmatch", "skin-lesions-few-labels", 256, 48, 200 * 100),
]


def rss_mib() -> float:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * resource.getpagesize() / 2 ** 20


def gan_step(batch: int, precision: str, device: str, alpha: float):
    from fedcli.generators.fid import FeatureSpace
    from fedcli.generators.perceptual import Perceptual
    from fedcli.generators.stylegan2.networks import Architecture
    from fedcli.generators.stylegan2.train import GanTrainer, TrainSettings

    arch = Architecture(resolution=256, channels=1, num_classes=2, z_dim=512, w_dim=512, channel_base=16384,
                        channel_max=512)
    pixels = FeatureSpace(lambda images: F.avg_pool2d(images, 32).flatten(1), "pixels", False)
    settings = TrainSettings(batch=batch, fid_images=4, precision=precision, r1_every=1)  # R1 in every timed step
    reals = torch.rand(max(batch, 4), 1, 256, 256) * 2 - 1
    trainer = GanTrainer(arch, settings, reals, torch.arange(len(reals)) % 2, Perceptual("vgg"), pixels,
                         torch.Generator(device=device).manual_seed(0), init_seed=1, device=device)
    return lambda: trainer.step(alpha)


def classifier_step(name: str, batch: int, precision: str, device: str, channels: int, classes: int):
    from fedcli.models.classifier import build_classifier
    from fedcli.training.local import LocalSettings, train_local
    from fedcli.training.objectives import Batch

    model = build_classifier(name, channels, classes, 0).to(device)
    settings = LocalSettings(epochs=1, lr=1e-3, batch=batch, optimizer="sgd", precision=precision)
    x, labels = torch.randn(batch, channels, 256, 256), torch.arange(batch) % classes
    return lambda: train_local(model, [Batch(x, labels, batch)], settings, device)


def vqvae_step(batch: int, precision: str, device: str, prior: bool):
    from fedcli.generators.vqvae2.codes import NodeCodes
    from fedcli.generators.vqvae2.kind import VqGenerator, train_prior, train_vqvae
    from fedcli.generators.vqvae2.networks import VqArchitecture
    from fedcli.generators.vqvae2.prior import PriorArchitecture

    arch = VqArchitecture(resolution=256, channels=3, num_classes=5, hidden=128, codes=512, dim=64)
    generator = VqGenerator(arch, PriorArchitecture(codes=512, num_classes=5, channels=128, layers=8)).to(device)
    cfg = types.SimpleNamespace(vq_lr=4e-4, vq_beta=0.25, batch=batch, iterations=1, prior_iterations=1,
                                precision=precision, compile=False)
    stream = torch.Generator(device=device).manual_seed(0)
    if prior:
        codes = NodeCodes(torch.randint(0, 512, (batch, 32, 32)), torch.randint(0, 512, (batch, 64, 64)),
                          torch.arange(batch) % 5)
        return lambda: train_prior(generator, codes, cfg, stream, device, lambda row: None)
    images = torch.rand(batch, 3, 256, 256) * 2 - 1
    return lambda: train_vqvae(generator.vqvae, images, cfg, stream, device, lambda row: None)


def build(component: Component, batch: int, precision: str, device: str):
    name = component.name
    if name.startswith("stylegan2"):
        return gan_step(batch, precision, device, alpha=1.0 if "L_PP" in name else 0.0)
    if name.startswith("vqvae2"):
        return vqvae_step(batch, precision, device, prior=name.endswith("prior"))
    channels, classes = {"resnet18": (1, 2), "resnet34": (3, 5)}.get(name, (3, 8))
    return classifier_step(name.split()[0], batch, precision, device, channels, classes)


def measure(index: int, precision: str) -> dict:
    """One component's step, in this process: peak memory and seconds per step at the measured batch."""
    component = COMPONENTS[index]
    device = "cuda" if torch.cuda.is_available() else "cpu"
    batch = component.batch if device == "cuda" else CPU_BATCH
    before = rss_mib()
    step = build(component, batch, precision, device)
    built = rss_mib()
    for _ in range(WARMUP):
        step()
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    for _ in range(TIMED):
        step()
    if device == "cuda":
        torch.cuda.synchronize()
    seconds = (time.perf_counter() - start) / TIMED
    if device == "cuda":
        peak, fixed = torch.cuda.max_memory_allocated() / 2 ** 20, 0.0
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - before
        fixed = built - before
    scale = component.batch / batch
    return {"component": component.name, "recipe": component.recipe, "precision": precision, "device": device,
            "batch": batch, "recipe_batch": component.batch, "peak_mib": peak,
            "projected_mib": fixed + (peak - fixed) * scale, "step_s": seconds * scale, "steps": component.steps,
            "hours": seconds * scale * component.steps / 3600}


def over_cap(component: Component, precision: str, cap: float) -> dict:
    """A measurement that did not end within `cap` seconds: its step takes longer than the cap less the set-up."""
    return {"component": component.name, "recipe": component.recipe, "precision": precision, "over_cap_s": cap,
            "batch": CPU_BATCH, "recipe_batch": component.batch, "steps": component.steps}


def cells(r: dict) -> str:
    if "over_cap_s" in r:
        return f"not done in {r['over_cap_s']:.0f} s | | over {r['over_cap_s'] * r['recipe_batch'] / r['batch'] / 2:,.0f} | " \
               f"{r['steps']:,} | |"
    return (f"{r['peak_mib']:,.0f} | {r['projected_mib']:,.0f} | {r['step_s']:.2f} | {r['steps']:,} | "
            f"{r['hours']:,.1f} |")


def table(rows: list[dict]) -> str:
    lines = ["| component | recipe | precision | batch measured / recipe's | peak MiB measured | MiB at recipe's "
             "batch | s per step at recipe's batch | steps | projected hours |",
             "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        lines.append(f"| {r['component']} | {r['recipe']} | {r['precision']} | {r['batch']} / {r['recipe_batch']} | "
                     + cells(r))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--precision", default="fp32,bf16")
    parser.add_argument("--only", default="", help="comma-separated component indices")
    parser.add_argument("--out", help="also write the rows as JSON here")
    parser.add_argument("--cap-s", type=float, default=CAP_S, help="seconds one measurement may take")
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one is not None:
        print(json.dumps(measure(args.one, args.precision)))
        return
    indices = [int(i) for i in args.only.split(",")] if args.only else range(len(COMPONENTS))
    rows = []
    for index in indices:
        for precision in args.precision.split(","):
            try:
                done = subprocess.run([sys.executable, __file__, "--one", str(index), "--precision", precision],
                                      capture_output=True, text=True, check=True, timeout=args.cap_s)
                rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
            except subprocess.TimeoutExpired:
                rows.append(over_cap(COMPONENTS[index], precision, args.cap_s))
            print(f"{rows[-1]['component']} {precision}: {rows[-1].get('step_s', 'over the cap')} s/step",
                  file=sys.stderr, flush=True)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    print(f"device: {device}, threads: {torch.get_num_threads()}, torch {torch.__version__}")
    print(table(rows))
    if args.out:
        with open(args.out, "w") as handle:
            json.dump(rows, handle, indent=1)


if __name__ == "__main__":
    main()
