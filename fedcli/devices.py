"""Device choice shared by the training stages: CUDA when present, else CPU; `--device` overrides."""

from __future__ import annotations

import torch

from fedcli.errors import UserError


def resolve_device(device: str) -> str:
    if device == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda, but no CUDA device is visible; use --device cpu")
    chosen = ("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device
    if chosen == "cuda":  # bitwise reproducibility is promised on CPU; on CUDA take what cuDNN offers
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
    return chosen
