"""Keyed random streams.

Every random draw in fedcli comes from a generator keyed by (seed, node, round, purpose, ...),
never from global state, so a node run alone, a resumed run and a multi-process run draw the
same numbers.
"""

from __future__ import annotations

import contextlib
import hashlib

import numpy as np


def stream_seed(seed: int, *keys: object) -> int:
    """A 63-bit integer derived from the seed and the keys; stable across runs and platforms."""
    text = "\x1f".join([str(int(seed)), *map(str, keys)])
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little") >> 1


def numpy_stream(seed: int, *keys: object) -> np.random.Generator:
    return np.random.Generator(np.random.PCG64(stream_seed(seed, *keys)))


def torch_stream(seed: int, *keys: object, device: str = "cpu"):
    import torch

    generator = torch.Generator(device=device)
    generator.manual_seed(stream_seed(seed, *keys))
    return generator


@contextlib.contextmanager
def keyed_global_rng(seed: int, *keys: object, device: str = "cpu"):
    """torch's global generators (CPU and `device`'s) seeded from the stream of `keys` for the block, then
    restored: what draws from them inside (torchvision's dropout and stochastic depth) is keyed as every other
    draw, the same on both engines and across a resume."""
    import torch

    devices = [torch.device(device)] if torch.device(device).type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(stream_seed(seed, *keys))
        yield
