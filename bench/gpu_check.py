"""The checks bench/gpu_check.sh runs: every stage's training step on the device at fp32 and at each reduced
precision the device offers (finite, and within a tolerance of fp32), DP-SGD's discriminator step, the
distributed engine against the in-process one (gloo on CUDA tensors: NCCL refuses two ranks on one GPU), and
bench/study_scale.py. Writes its findings, one line each, to --findings; exits 1 if any check failed.

`--dry-run` runs the same logic on the CPU (bf16 only: CPU has no fp16) at the smallest sizes, without the study
table. `--inject-nan STEP` fills that step's inputs with NaN, to show a NaN fails the check."""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

import pandas as pd
import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent.parent
TOLERANCE = 0.1  # relative, reduced precision's last loss against fp32's after STEPS steps
STEPS = 3
SIZE = {"cuda": 32, "cpu": 16}  # px of every step check: the dry run's smallest
TINY = ["--iterations", "8", "--patience", "100", "--pp-iterations", "4", "--fid-every", "4", "--fid-images", "16",
        "--batch", "8", "--channel-base", "128", "--channel-max", "16", "--z-dim", "16", "--w-dim", "16",
        "--buffer-size", "20", "--fidelity-epochs", "1", "--fidelity-seeds", "1"]


class Findings:
    def __init__(self, path: Path):
        self.path, self.failed = path, []
        path.write_text("")

    def add(self, name: str, ok: bool, detail: str) -> None:
        line = f"{'PASS' if ok else 'FAIL'} {name}: {detail}"
        print(line, flush=True)
        with open(self.path, "a") as handle:
            handle.write(line + "\n")
        if not ok:
            self.failed.append(name)


def poisoned(x: torch.Tensor, inject: bool) -> torch.Tensor:
    return torch.full_like(x, math.nan) if inject else x


def small_gan(size: int):
    from fedcli.generators.stylegan2.networks import Architecture

    return Architecture(resolution=size, channels=1, num_classes=2, z_dim=32, w_dim=32, channel_base=16 * size,
                        channel_max=64)


def gan_trainer(precision: str, device: str, inject: bool, dp=None):
    """A small GAN's trainer on random images (NaN with `inject`); with `dp`, its D trains by DP-SGD."""
    from fedcli.generators.fid import FeatureSpace
    from fedcli.generators.perceptual import Perceptual
    from fedcli.generators.stylegan2.train import GanTrainer, TrainSettings

    size = SIZE[device]
    pixels = FeatureSpace(lambda images: F.avg_pool2d(images, 8).flatten(1), "pixels", False)
    reals = poisoned(torch.rand(32, 1, size, size) * 2 - 1, inject)
    return GanTrainer(small_gan(size), TrainSettings(batch=8, fid_images=8, precision=precision, style_mixing=0.0),
                      reals, torch.arange(32) % 2, Perceptual("alex"), pixels,
                      torch.Generator(device=device).manual_seed(0), init_seed=1, device=device, dp=dp,
                      noise=torch.Generator(device=device).manual_seed(1))


def gan_loss(precision: str, device: str, inject: bool) -> float:
    trainer = gan_trainer(precision, device, inject)
    return [trainer.step(alpha=1.0) for _ in range(STEPS)][-1]["loss_d"]


def dp_loss(precision: str, device: str, inject: bool) -> float:
    """The DP-SGD discriminator step (per-example clipping and noise, fp32 under any --precision): the sum of D's
    weights after it, since under DP no loss computed from real images is logged."""
    from fedcli.generators.private import DpPlan

    plan = DpPlan(target_epsilon=8.0, delta=1e-3, max_grad_norm=1.0, sample_rate=0.25, steps=STEPS,
                  noise_multiplier=1.0, images=32)
    trainer = gan_trainer(precision, device, inject, dp=plan)
    for _ in range(STEPS):
        trainer.step()
    return float(sum(p.detach().double().sum() for p in trainer.D.parameters()))


def vqvae_loss(precision: str, device: str, inject: bool) -> float:
    from fedcli.generators.vqvae2.kind import train_vqvae
    from fedcli.generators.vqvae2.networks import VqArchitecture, VqVae2

    torch.manual_seed(0)
    size = SIZE[device]
    model = VqVae2(VqArchitecture(resolution=size, channels=1, num_classes=2, hidden=32, codes=32, dim=16)).to(device)
    cfg = types.SimpleNamespace(vq_lr=4e-4, vq_beta=0.25, batch=8, iterations=STEPS, precision=precision,
                                compile=False)
    rows = []
    train_vqvae(model, poisoned(torch.rand(32, 1, size, size) * 2 - 1, inject), cfg,
                torch.Generator(device=device).manual_seed(0), device, rows.append)
    return rows[-1]["mse"]


def classifier_loss(precision: str, device: str, inject: bool) -> float:
    from fedcli.models.classifier import build_classifier
    from fedcli.training.local import LocalSettings, train_local
    from fedcli.training.objectives import Batch

    model = build_classifier("resnet18", 1, 2, 0).to(device)
    x, labels = poisoned(torch.randn(8, 1, SIZE[device], SIZE[device]), inject), torch.arange(8) % 2
    settings = LocalSettings(epochs=1, lr=0.01, batch=8, optimizer="sgd", precision=precision)
    train_local(model, [Batch(x, labels, 8)] * STEPS, settings, device)
    model.eval()
    with torch.no_grad():
        return F.cross_entropy(model(x.to(device)), labels.to(device)).item()


def projection_loss(precision: str, device: str, inject: bool) -> float:
    from fedcli.audit.projection import ProjectionSettings, project
    from fedcli.generators.perceptual import Perceptual
    from fedcli.generators.stylegan2.networks import Generator

    torch.manual_seed(0)
    size = SIZE[device]
    generator = Generator(small_gan(size)).to(device).eval().requires_grad_(False)
    targets = poisoned(torch.rand(4, 1, size, size, device=device) * 2 - 1, inject)
    w = generator.styles(torch.randn(4, 32, device=device), torch.arange(4, device=device) % 2)
    result = project(lambda w_: generator.synthesis(w_, noise_mode="const"), targets, w,
                     Perceptual("alex").to(device), ProjectionSettings(steps=STEPS, precision=precision),
                     [torch.Generator().manual_seed(i) for i in range(4)], w_spread=1.0)
    return result.lpips.mean().item()


STEP_CHECKS = {"gan": gan_loss, "dp-sgd": dp_loss, "vqvae2": vqvae_loss, "classifier": classifier_loss,
               "projection": projection_loss}


def check_steps(findings: Findings, device: str, inject: str | None, only: str | None) -> None:
    reduced = ["bf16"] + (["fp16"] if device == "cuda" else [])
    for name, run in STEP_CHECKS.items():
        if only not in (None, name):
            continue
        values = {}
        for precision in ["fp32", *reduced]:
            start = time.perf_counter()
            try:
                values[precision] = run(precision, device, inject == name)
            except Exception as exc:  # a check's failure is a finding, not the end of the run
                findings.add(f"{name} {precision}", False, f"raised {type(exc).__name__}: {exc}")
                continue
            value, reference = values[precision], values.get("fp32", math.nan)
            finite = math.isfinite(value)
            near = precision == "fp32" or abs(value - reference) <= TOLERANCE * abs(reference)
            findings.add(f"{name} {precision}", finite and near,
                         f"{value:.5g} ({'finite' if finite else 'NOT FINITE'}; fp32 {reference:.5g}; "
                         f"{time.perf_counter() - start:.1f} s)")


def fedcli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fedcli", *map(str, args)], capture_output=True, text=True,
                          env=env)


def check_engines(findings: Findings, device: str) -> None:
    """One fedavg round on three nodes in process and on the distributed engine (one process per node), on the
    device: equal metrics on CPU, close on CUDA (its kernels need not sum in one order)."""
    with tempfile.TemporaryDirectory() as tmp:
        exp = Path(tmp) / "exp"
        done = fedcli("partition", "--exp", exp, "--nodes", "3", "--image-size", "16", "--threads", "1")
        if done.returncode:
            findings.add("partition", False, (done.stderr.strip().splitlines() or ["no output"])[-1])
            return
        run = ["--strategy", "fedavg", "--rounds", "1", "--epochs", "1", "--bootstrap", "10", "--device", device,
               "--threads", "1"]
        metrics = {}
        for engine in ("inprocess", "distributed"):
            target = Path(tmp) / engine
            subprocess.run(["cp", "-r", str(exp), str(target)], check=True)
            extra = ["--engine", "distributed", "--launch", "local"] if engine == "distributed" else []
            done = fedcli("federate", "--exp", target, *run, *extra)
            if done.returncode:
                findings.add(f"federate {engine}", False, (done.stderr.strip().splitlines() or ["no output"])[-1])
                return
            metrics[engine] = pd.read_csv(target / "federate" / "fedavg" / "metrics.csv")["accuracy"]
        gap = float((metrics["inprocess"] - metrics["distributed"]).abs().max())
        finite = bool(metrics["distributed"].notna().all())
        findings.add("federate distributed (gloo)", finite and (gap == 0 if device == "cpu" else gap <= 0.05),
                     f"largest accuracy gap to the in-process engine {gap:.4g} over {len(metrics['inprocess'])} rows")


def check_study_scale(findings: Findings, out: Path) -> None:
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "study_scale.py"), "--out", str(out)],
                          capture_output=True, text=True)
    with open(findings.path, "a") as handle:
        handle.write(done.stdout)
    findings.add("study_scale", done.returncode == 0, f"table above; rows in {out}" if done.returncode == 0
                 else (done.stderr.strip().splitlines() or ["no output"])[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dry-run", action="store_true", help="on the CPU, smallest sizes, no study table")
    parser.add_argument("--inject-nan", choices=sorted(STEP_CHECKS), help="fill this step's inputs with NaN")
    parser.add_argument("--steps-only", action="store_true", help="only the step checks: no engines, no table")
    parser.add_argument("--only", choices=sorted(STEP_CHECKS), help="of the step checks, this one")
    parser.add_argument("--findings", type=Path, default=Path("gpu-check-findings.txt"))
    args = parser.parse_args()
    device = "cpu" if args.dry_run else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        print("error: no CUDA device is visible; run with --dry-run on a CPU machine", file=sys.stderr)
        return 2
    findings = Findings(args.findings)
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu (dry run)"
    findings.add("device", True, f"{name}, torch {torch.__version__}, threads {torch.get_num_threads()}")
    check_steps(findings, device, args.inject_nan, args.only)
    if not args.steps_only:
        check_engines(findings, device)
    if not (args.dry_run or args.steps_only):
        check_study_scale(findings, args.findings.with_suffix(".json"))
    findings.add("summary", not findings.failed, f"failed: {', '.join(findings.failed) or 'none'}")
    return 1 if findings.failed else 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())
