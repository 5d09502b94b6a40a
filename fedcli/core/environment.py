"""The software and machine a stage ran on, for its `config.json` (`environment`).

Another torch, numpy or CPU instruction set can give other numbers from the same options and seed,
so a result is only reproducible with these at hand. They are a record, never an input: no
up-to-date check, resume or engine comparison reads them (the ledger's fingerprint takes the torch
version on its own, see pipeline/ledger.py), so resuming after a code change or on another machine
still works.
"""

from __future__ import annotations

import functools
import importlib.metadata
import platform
import subprocess
from pathlib import Path
from typing import Any

CHECKOUT = Path(__file__).resolve().parents[1]  # the repository root when fedcli runs from a git checkout


@functools.cache
def environment() -> dict[str, Any]:
    import numpy
    import torch

    cudnn = torch.backends.cudnn
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "torchvision": installed("torchvision"),
        "numpy": numpy.__version__,
        "opacus": installed("opacus"),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cuda": torch.version.cuda,
        "cudnn": cudnn.version() if cudnn.is_available() else None,
        "git_commit": git_commit(),
    }


def installed(distribution: str) -> str | None:
    """A distribution's version without importing it (opacus takes seconds to import); None when absent."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def git_commit() -> str | None:
    """The commit of the fedcli source, with `+dirty` when it has uncommitted changes; None for an installed
    copy (no `.git` next to the package: a surrounding repository, e.g. one holding the venv, is not fedcli's)."""
    if not (CHECKOUT / ".git").exists():
        return None
    try:
        commit = git("rev-parse", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no", "--", "fedcli")
    except (OSError, subprocess.SubprocessError):
        return None
    return commit + ("+dirty" if dirty else "")


def git(*args: str) -> str:
    """Read-only: no optional locks, so a commit running in the checkout at the same time is not disturbed."""
    return subprocess.run(["git", "-C", str(CHECKOUT), "--no-optional-locks", *args], capture_output=True, text=True,
                          check=True, timeout=30).stdout.strip()
