"""GAN losses: non-saturating logistic loss, R1 regularisation, and the FedER privacy loss."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def d_logistic(real_logits: torch.Tensor, fake_logits: torch.Tensor) -> torch.Tensor:
    return d_fake(fake_logits) + d_real(real_logits)


def d_fake(fake_logits: torch.Tensor) -> torch.Tensor:
    """D's loss on synthetic images: the half of the logistic loss that reads no real image."""
    return F.softplus(fake_logits).mean()


def d_real(real_logits: torch.Tensor) -> torch.Tensor:
    return F.softplus(-real_logits).mean()


def g_nonsaturating(fake_logits: torch.Tensor) -> torch.Tensor:
    return F.softplus(-fake_logits).mean()


def r1_penalty(discriminator, reals: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean squared norm of the gradient of D(real) with respect to the real images, and D(real).

    The loss adds gamma / 2 times this penalty (Mescheder et al. 2018).
    """
    reals = reals.detach().requires_grad_(True)
    logits = discriminator(reals, labels)
    (grad,) = torch.autograd.grad(logits.sum(), reals, create_graph=True)
    return grad.square().sum(dim=(1, 2, 3)).mean(), logits


def privacy_loss(perceptual, reals: torch.Tensor, fakes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The study's all-pairs L_PP = (1/b) * sum over all b x b real/synthetic pairs of LPIPS(real, synthetic),
    labels ignored,
    and the mean pairwise LPIPS. Each image's features are computed once; the real side carries
    no gradient, so the loss reaches the generator only."""
    with torch.no_grad():
        real_features = perceptual.features(reals)
    distances = perceptual.pairwise(real_features, perceptual.features(fakes))
    return distances.sum() / reals.shape[0], distances.mean()


def nearest_privacy_loss(perceptual, real_features: list[torch.Tensor], fakes: torch.Tensor
                         ) -> tuple[torch.Tensor, torch.Tensor]:
    """L_PP in nearest form: sum over the b synthetic images of the LPIPS to the nearest of the node's real
    training images (features given, computed once), and the mean of those distances. The study's
    all-pairs form sums each synthetic image's *mean* distance to the batch's reals, a push away from the
    data as a whole; this one pushes each synthetic image away from the one real image it is closest
    to, where a memorised member would be."""
    nearest = perceptual.pairwise(perceptual.features(fakes), real_features).min(dim=1).values
    return nearest.sum(), nearest.mean()


@torch.no_grad()
def real_reference(perceptual, real_features: list[torch.Tensor], form: str) -> float:
    """The node's real-vs-real LPIPS in L_PP's own form: the mean distance between two different real images
    (all-pairs) or from each real image to its nearest other one (nearest). Dividing L_PP by it (the
    relative scale) makes alpha a multiple of the data's own spread, whatever the backbone's units:
    a random AlexNet's distances are about 10x smaller than calibrated LPIPS."""
    distances = perceptual.pairwise(real_features, real_features).double()
    distances.fill_diagonal_(float("inf") if form == "nearest" else 0.0)
    n = len(distances)
    value = distances.min(dim=1).values.mean() if form == "nearest" else distances.sum() / (n * (n - 1))
    return float(value)
