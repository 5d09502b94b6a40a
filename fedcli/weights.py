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
        raise UserError(f"{what} {path} is not a readable PyTorch state dict ({exc})") from exc
