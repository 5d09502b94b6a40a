"""Device choice shared by the training stages: CUDA when present, else CPU; `--device` overrides.
Also the CPU thread count and a distributed rank's backend."""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable, Iterator

import torch

from fedcli.core.errors import UserError


def resolve_device(device: str) -> str:
    if device == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda, but no CUDA device is visible; use --device cpu")
    chosen = ("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device
    if chosen == "cuda":  # bitwise reproducibility is promised on CPU; on CUDA take what cuDNN offers
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
    return chosen


@contextlib.contextmanager
def torch_threads(threads: int | None) -> Iterator[None]:
    """Run a block with `threads` CPU threads (results on CPU depend on the thread count)."""
    if threads is None:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def with_threads(run: Callable) -> Callable:
    """A stage's `run(cfg, ...)` under `torch_threads(cfg.threads)` (the stage's `--threads`)."""
    @functools.wraps(run)
    def wrapped(cfg, *args, **kwargs):
        with torch_threads(cfg.threads):
            return run(cfg, *args, **kwargs)
    return wrapped


def distributed_backend(device: str) -> tuple[str, str]:
    """(backend, device) of a distributed rank: gloo on CPU; nccl with one GPU per process on this
    machine, else gloo with the GPUs shared (NCCL refuses two ranks on one GPU)."""
    if device != "cuda":
        return "gloo", "cpu"
    local_rank, local_world = int(os.environ.get("LOCAL_RANK", 0)), int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    count = torch.cuda.device_count()
    return ("nccl" if local_world <= count else "gloo"), f"cuda:{local_rank % count}"
