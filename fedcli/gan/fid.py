"""Fréchet distance between real and generated images in a feature space.

Inception-v3 (torchvision's ImageNet weights, from `--fid-weights` or the torch hub cache) when
available, named `inception`. Otherwise the penultimate features of a small CNN trained on the
node's own training images, named `cnn-node` (the domain-classifier FID used for digit GANs,
where Inception's ImageNet features say little): it sees the classes and the scanner, it is not
the LPIPS network the privacy loss pushes against (so L_PP cannot move FID by moving that
network's features), and its 128 features are few enough for 256 images to estimate their
covariance. Uncalibrated: comparable within a node's run (selection and stopping), not with
published FIDs or across nodes.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import scipy.linalg
import torch
import torch.nn.functional as F
from torch import nn

from fedcli.gan.perceptual import warn_fallback
from fedcli.weights import BACKBONES, hub_checkpoint, load_state

INCEPTION_FILE = BACKBONES["inception"].filename
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
CLASSIFIER_NAME = "cnn-node"


class FeatureSpace:
    """`embed(images)`: features of float images in [-1, 1], without gradients."""

    def __init__(self, embed: Callable[[torch.Tensor], torch.Tensor], name: str, calibrated: bool):
        self._embed, self.name, self.calibrated = embed, name, calibrated

    @torch.no_grad()
    def embed(self, images: torch.Tensor) -> torch.Tensor:
        return self._embed(images)


def inception_space(weights: Path | None, device: str = "cpu") -> FeatureSpace | None:
    """Inception-v3's pool features from `weights` or the hub cache; None (and a warning) when absent."""
    source = weights or hub_checkpoint(INCEPTION_FILE)
    if source is None:
        warn_fallback("fid-classifier", f"no Inception weights for FID (fedcli weights fetch inception puts "
                      f"{INCEPTION_FILE} in the torch hub cache, or pass --fid-weights); FID uses the features "
                      f"of a small CNN trained on each node's training images, named 'fid[{CLASSIFIER_NAME}]', "
                      "uncalibrated")
        return None
    from torchvision.models import inception_v3

    # the ImageNet weights expect transform_input (their own input normalisation) on
    net = inception_v3(weights=None, aux_logits=True, init_weights=False, transform_input=True)
    net.load_state_dict(load_state(Path(source), "Inception weights"))
    net.fc = nn.Identity()
    net = net.eval().requires_grad_(False).to(device)

    def embed(images: torch.Tensor) -> torch.Tensor:
        x = images.expand(-1, 3, -1, -1) if images.shape[1] == 1 else images
        x = F.interpolate((x + 1) / 2, size=(299, 299), mode="bilinear", align_corners=False)
        mean = torch.tensor(IMAGENET_MEAN, device=x.device).view(1, 3, 1, 1)
        std = torch.tensor(IMAGENET_STD, device=x.device).view(1, 3, 1, 1)
        return net((x - mean) / std)

    return FeatureSpace(embed, "inception", True)


def classifier_space(classifier: nn.Module) -> FeatureSpace:
    """The penultimate features (`classifier.features`) of a trained SmallCNN, in eval mode."""
    classifier = classifier.eval().requires_grad_(False)
    return FeatureSpace(classifier.features, CLASSIFIER_NAME, False)


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
