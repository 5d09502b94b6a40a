"""DP-SGD noise for deployment (`train-gan --dp-noise secure`): Gaussians from a CSPRNG seeded by the OS.

The default (`keyed`) draws DP-SGD's noise from a torch.Generator keyed by the run's seed, so a run is
reproducible; but config.json records the seed, and whoever holds it regenerates the noise and subtracts it
from the released model: the DP guarantee then holds only while the seed stays secret. Here every draw comes
from ChaCha20 under a fresh key from os.urandom, which no record holds, at the price of reproducibility.
(Opacus's own secure_mode needs torchcsprng, which has no build for current torch.)
"""

from __future__ import annotations

import os

import numpy as np
import torch
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from opacus.optimizers import DPOptimizer
from opacus.optimizers.optimizer import _check_processed_flag, _mark_as_processed


def standard_normal(count: int) -> np.ndarray:
    """`count` independent standard Gaussians in float64: a ChaCha20 keystream under a fresh 32-byte key from
    os.urandom (its 16-byte nonce: a zero block counter, so no draw wraps it, and 12 random bytes), read as
    64-bit words, each word's top 53 bits a uniform in (0, 1], paired by Box-Muller."""
    pairs = (count + 1) // 2
    keystream = Cipher(algorithms.ChaCha20(os.urandom(32), bytes(4) + os.urandom(12)), mode=None).encryptor()
    words = np.frombuffer(keystream.update(bytes(16 * pairs)), dtype="<u8")
    uniforms = ((words >> 11) + 1) * 2.0 ** -53  # never 0: the logarithm below stays finite
    radius = np.sqrt(-2 * np.log(uniforms[:pairs]))
    angle = 2 * np.pi * uniforms[pairs:]
    return np.concatenate([radius * np.cos(angle), radius * np.sin(angle)])[:count]


def gaussian_like(reference: torch.Tensor, std: float) -> torch.Tensor:
    """Noise of std `std` in `reference`'s shape, dtype and device, drawn in float64 on the CPU."""
    noise = torch.from_numpy(standard_normal(reference.numel()) * std).reshape(reference.shape)
    return noise.to(device=reference.device, dtype=reference.dtype)


class SecureDPOptimizer(DPOptimizer):
    """Opacus's DPOptimizer with its Gaussian noise (std sigma x C on the summed clipped gradient) drawn by
    `gaussian_like` instead of a torch.Generator."""

    def add_noise(self) -> None:
        std = self.noise_multiplier * self.max_grad_norm
        for p in self.params:
            _check_processed_flag(p.summed_grad)
            p.grad = (p.summed_grad + gaussian_like(p.summed_grad, std)).view_as(p)
            _mark_as_processed(p.summed_grad)
