"""bench/gpu_check.sh's dry run: the GPU check's logic on the CPU passes, and a NaN in a step fails it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def dry_run(findings: Path, *options: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(ROOT / "bench" / "gpu_check.sh"), "--dry-run", str(findings), *options],
                          capture_output=True, text=True, env={**os.environ, "PYTHON": sys.executable,
                                                               "OMP_NUM_THREADS": "1"})


def test_the_dry_run_passes_on_cpu_and_writes_every_step_check(tmp_path):
    """The step checks; the engines' check (a fedavg round in process and distributed) is the distributed tests'
    own, and the study table is skipped by every dry run."""
    done = dry_run(tmp_path / "findings.txt", "--steps-only")
    lines = (tmp_path / "findings.txt").read_text().splitlines()
    assert done.returncode == 0, done.stdout + done.stderr
    checked = {line.split(":")[0] for line in lines}
    assert {f"PASS {step} {p}" for step in ("gan", "dp-sgd", "vqvae2", "classifier", "projection")
            for p in ("fp32", "bf16")} <= checked
    assert lines[-1] == "PASS summary: failed: none"


def test_a_nan_in_a_step_fails_the_dry_run_naming_it(tmp_path):
    done = dry_run(tmp_path / "findings.txt", "--inject-nan", "vqvae2", "--steps-only", "--only", "vqvae2")
    lines = (tmp_path / "findings.txt").read_text().splitlines()
    assert done.returncode == 1
    assert any(line.startswith("FAIL vqvae2 fp32") and "NOT FINITE" in line for line in lines), lines
    assert lines[-1] == "FAIL summary: failed: vqvae2 fp32, vqvae2 bf16"
