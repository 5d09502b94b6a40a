"""Pretrained weights, offline: a file the user gives, else torchvision's file in the torch hub cache.

Nothing is downloaded. Files are read with `weights_only=True`, so loading runs no pickled code.
"""

from __future__ import annotations

from pathlib import Path

import torch

from fedcli.errors import UserError


def hub_checkpoint(filename: str) -> Path | None:
    """torchvision's cached file `filename` (`$TORCH_HOME/hub/checkpoints/`), if it is there."""
    path = Path(torch.hub.get_dir()) / "checkpoints" / filename
    return path if path.is_file() else None


def load_state(path: Path, what: str) -> dict:
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises many types for a bad file
        raise UserError(f"{what} {path} is not a plain PyTorch state dict of tensors ({load_failure(exc)}); fedcli "
                        "never runs pickled code from a weights file, so give torchvision's own weights file") from exc


def load_failure(exc: Exception) -> str:
    """Why torch refused a file, without its advice to load it with weights_only=False: that advice is
    wrong for a file from elsewhere, which could run code."""
    text = str(exc)
    if "WeightsUnpickler error:" in text:
        detail = text.split("WeightsUnpickler error:", 1)[1].strip().splitlines()
        first = detail[0].split(". ")[0].strip() if detail else "unsupported content"
        return f"not loadable without running pickled code: {first[:160]}"
    return (text.strip().splitlines() or [type(exc).__name__])[0][:200]
