"""Fréchet distance between real and generated images in a feature space.

Inception-v3 (torchvision's ImageNet weights, from `--fid-weights` or the torch hub cache) when
available, named `inception`; otherwise the LPIPS backbone's pooled deepest features at no extra
cost, named after it (`vgg-random`, ...), divided by the real features' spread (so the value
reads in units of the real data's variance), and uncalibrated: comparable within a run (early
stopping), not with published FIDs.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import scipy.linalg
import torch
import torch.nn.functional as F

from fedcli.gan.perceptual import Perceptual, warn_fallback
from fedcli.weights import hub_checkpoint, load_state

INCEPTION_FILE = "inception_v3_google-0cc3c7bd.pth"
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


class FeatureSpace:
    def __init__(self, perceptual: Perceptual, weights: Path | None = None, device: str = "cpu"):
        source = weights or hub_checkpoint(INCEPTION_FILE)
        self.inception = None
        if source is not None:
            from torchvision.models import inception_v3

            net = inception_v3(weights=None, aux_logits=True, init_weights=False)
            net.load_state_dict(load_state(Path(source), "Inception weights"))
            net.fc = torch.nn.Identity()
            self.inception = net.eval().requires_grad_(False).to(device)
            self.name, self.calibrated = "inception", True
        else:
            self.name, self.calibrated = perceptual.name, False
            warn_fallback(f"fid-{self.name}", f"no Inception weights for FID (pass --fid-weights or put "
                          f"{INCEPTION_FILE} in the torch hub cache); FID uses the LPIPS backbone's pooled "
                          f"features, named 'fid[{self.name}]', uncalibrated")
        self.perceptual = perceptual

    @torch.no_grad()
    def embed(self, images: torch.Tensor) -> torch.Tensor:
        """Features of float images in [-1, 1]."""
        if self.inception is None:
            return self.perceptual.pooled(images)
        x = images.expand(-1, 3, -1, -1) if images.shape[1] == 1 else images
        x = F.interpolate((x + 1) / 2, size=(299, 299), mode="bilinear", align_corners=False)
        mean = torch.tensor(IMAGENET_MEAN, device=x.device).view(1, 3, 1, 1)
        std = torch.tensor(IMAGENET_STD, device=x.device).view(1, 3, 1, 1)
        return self.inception((x - mean) / std)


def statistics(features: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    f = features.double().cpu().numpy()
    return f.mean(axis=0), np.cov(f, rowvar=False)


def frechet_distance(stats_a: tuple[np.ndarray, np.ndarray], stats_b: tuple[np.ndarray, np.ndarray]) -> float:
    (mu_a, sigma_a), (mu_b, sigma_b) = stats_a, stats_b
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", scipy.linalg.LinAlgWarning)  # fewer images than features: singular
        covmean = scipy.linalg.sqrtm(sigma_a @ sigma_b)
        if not np.isfinite(covmean).all():
            eps = np.eye(len(mu_a)) * 1e-6
            covmean = scipy.linalg.sqrtm((sigma_a + eps) @ (sigma_b + eps))
    covmean = covmean.real
    return float(np.square(mu_a - mu_b).sum() + np.trace(sigma_a) + np.trace(sigma_b) - 2 * np.trace(covmean))
