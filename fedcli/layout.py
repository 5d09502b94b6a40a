"""Where each stage's artifacts live inside an experiment folder (see the README's layout)."""

from __future__ import annotations

from pathlib import Path

GENERATOR = "generator.safetensors"  # phase 2, privacy-preserving (EMA)
GENERATOR_PHASE1 = "generator_phase1.safetensors"  # phase 1, standard GAN (EMA)
BUFFER = "buffer.safetensors"


def gan_dir(exp: Path, node: str) -> Path:
    return Path(exp) / "gan" / node


def federate_dir(exp: Path, strategy: str, fold: int | None = None) -> Path:
    base = Path(exp) / "federate"
    return base / strategy if fold is None else base / "cv" / strategy / f"fold{fold}"


def audit_dir(exp: Path, node: str) -> Path:
    return Path(exp) / "audit" / node
