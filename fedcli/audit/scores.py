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


SSIM_WINDOW, SSIM_SIGMA, SSIM_K1, SSIM_K2 = 11, 1.5, 0.01, 0.03  # Wang et al. 2004
DATA_RANGE = 2.0  # images in [-1, 1]


def ssim(a: torch.Tensor, b: torch.Tensor, chunk: int = 32) -> torch.Tensor:
    """Mean structural similarity per image pair (N, C, H, W) in [-1, 1], as Wang et al. 2004 define it, so
    its numbers compare with published ones: an 11x11 Gaussian window of sigma 1.5, K1 0.01, K2 0.03, data
    range 2, population (co)variances, the mean over every window that lies inside the image and over the
    channels (scikit-image's structural_similarity with gaussian_weights=True, sigma=1.5,
    use_sample_covariance=False). An image smaller than 11 pixels on a side gets the largest odd window
    that fits, its Gaussian (sigma 1.5) cut there and renormalised, rather than no score. Computed in
    float64 (E[x^2] - E[x]^2 cancels in float32), `chunk` pairs at a time."""
    return torch.cat([chunk_ssim(a[i:i + chunk], b[i:i + chunk]) for i in range(0, len(a), chunk)])


def chunk_ssim(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    size = min(SSIM_WINDOW, *a.shape[-2:])
    size -= 1 - size % 2
    dtype, a, b = a.dtype, a.double(), b.double()
    channels = a.shape[1]
    offsets = torch.arange(size, dtype=torch.float64, device=a.device) - size // 2
    g = torch.exp(-0.5 * (offsets / SSIM_SIGMA) ** 2)
    g = g / g.sum()
    kernel = (g[:, None] * g[None, :]).expand(channels, 1, size, size)

    def blur(x):
        return F.conv2d(x, kernel, groups=channels)

    mu_a, mu_b = blur(a), blur(b)
    var_a, var_b = blur(a * a) - mu_a ** 2, blur(b * b) - mu_b ** 2
    cov = blur(a * b) - mu_a * mu_b
    c1, c2 = (SSIM_K1 * DATA_RANGE) ** 2, (SSIM_K2 * DATA_RANGE) ** 2
    value = ((2 * mu_a * mu_b + c1) * (2 * cov + c2)) / ((mu_a ** 2 + mu_b ** 2 + c1) * (var_a + var_b + c2))
    return value.flatten(1).mean(dim=1).to(dtype)


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


def psnr(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Peak signal-to-noise ratio per image pair in dB, images in [-1, 1] (peak-to-peak 2)."""
    mse = (a.double() - b.double()).flatten(1).square().mean(dim=1)
    return (10 * torch.log10(DATA_RANGE ** 2 / mse.clamp_min(1e-20))).float()


def reconstruction_scores(perceptual, reconstructions: torch.Tensor, originals: torch.Tensor,
                          others: torch.Tensor) -> dict[str, torch.Tensor]:
    """Each reconstruction scored by PSNR, SSIM and LPIPS against its original and against the nearest of `others`
    (every other real image the attacker could confuse it with; nearest under that score), and `reconstructed_*`
    where it is closer to its original than to any of them: a reconstruction of that patient, not of a typical
    image. Higher PSNR and SSIM, lower LPIPS, are closer."""
    def nearest_other(score) -> torch.Tensor:  # the highest score over the others, per reconstruction
        return torch.stack([score(r.expand_as(others), others).max() for r in reconstructions])

    rebuilt = perceptual.features_of(reconstructions)  # once, for both LPIPS readings
    with torch.no_grad():
        scores = {"psnr": psnr(reconstructions, originals), "psnr_nearest_other": nearest_other(psnr),
                  "ssim": ssim(reconstructions, originals), "ssim_nearest_other": nearest_other(ssim),
                  "lpips": perceptual.paired(rebuilt, perceptual.features_of(originals)),
                  "lpips_nearest_other": perceptual.pairwise(rebuilt, perceptual.features_of(others)).amin(1)}
    for name in ("psnr", "ssim"):
        scores[f"reconstructed_{name}"] = scores[name] > scores[f"{name}_nearest_other"]
    scores["reconstructed_lpips"] = scores["lpips"] < scores["lpips_nearest_other"]
    return scores
