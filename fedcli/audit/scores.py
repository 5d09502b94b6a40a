"""Distances and attack scores of the audit.

Pixel L2 (RMS per pixel on [-1, 1]) and SSIM are independent of the LPIPS the generator was
trained against, so a generator that games LPIPS shows up in them. Membership inference follows
GAN-Leaks: score = minus the projection distance (fedcli/audit/effects.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def pixel_l2(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (a - b).flatten(1).square().mean(dim=1).sqrt()


def ssim(a: torch.Tensor, b: torch.Tensor, window: int = 7, sigma: float = 1.5) -> torch.Tensor:
    """Mean structural similarity per image pair, images in [-1, 1] (Gaussian window, per channel)."""
    a, b = (a + 1) / 2, (b + 1) / 2
    channels = a.shape[1]
    offsets = torch.arange(window, dtype=a.dtype) - window // 2
    g = torch.exp(-0.5 * (offsets / sigma) ** 2)
    g = (g / g.sum()).to(a.device)
    kernel = (g[:, None] * g[None, :]).expand(channels, 1, window, window)

    def blur(x):
        return F.conv2d(x, kernel, groups=channels)

    mu_a, mu_b = blur(a), blur(b)
    var_a, var_b = blur(a * a) - mu_a ** 2, blur(b * b) - mu_b ** 2
    cov = blur(a * b) - mu_a * mu_b
    c1, c2 = 0.01 ** 2, 0.03 ** 2
    value = ((2 * mu_a * mu_b + c1) * (2 * cov + c2)) / ((mu_a ** 2 + mu_b ** 2 + c1) * (var_a + var_b + c2))
    return value.flatten(1).mean(dim=1)


def distance_matrix(perceptual, queries: torch.Tensor, pool: torch.Tensor, chunk: int = 256) -> torch.Tensor:
    """(len(queries), len(pool)) LPIPS distances; each image's features computed once."""
    pool_features = perceptual.features_of(pool, chunk)
    with torch.no_grad():
        return torch.cat([perceptual.pairwise(perceptual.features(queries[i:i + chunk]), pool_features)
                          for i in range(0, len(queries), chunk)])


def nearest(matrix: torch.Tensor, exclude: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's smallest distance and its column; row i skips column exclude[i] (the query itself,
    when the queries are drawn from the pool)."""
    if exclude is not None:
        matrix = matrix.clone()
        matrix[torch.arange(len(matrix)), exclude] = float("inf")
    return matrix.min(dim=1)
