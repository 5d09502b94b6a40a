"""Latent backprojection after the StyleGAN2 projector, for many images at once.

Each target image gets its own w (W space, one w per image, broadcast to every layer), starting
from the generator's start for it (StyleGAN: its class's mean w). All w of a batch are optimised together with Adam: the
loss is the sum
of the per-image LPIPS, so the images do not interact. The learning rate ramps up over the first
5% of the steps and down (cosine) over the last 25%; early on, Gaussian noise shrinking to zero
is added to w to explore, as in the projector. Per-layer noise inputs stay fixed (`const`) unless
`optimize_noise`, which also optimises them with the projector's noise regulariser; at small
resolutions free noise has more values than the image has pixels, so it lets any generator
rebuild any image.

Every random draw of an image comes from that image's own stream, and the noise regulariser and
renormalisation act on each image's maps alone, so an image's result does not depend on the batch
it is in, its position there, or its companions (to float64 rounding; float32 kernels that differ
with the batch size still move it slightly).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import torch

from fedcli.core.precision import Scaled, autocast
from fedcli.generators.perceptual import Perceptual


@dataclasses.dataclass(frozen=True)
class ProjectionSettings:
    steps: int = 100
    lr: float = 0.1
    rampup: float = 0.05
    rampdown: float = 0.25
    noise_factor: float = 0.05  # initial w noise, times the spread of w
    noise_ramp: float = 0.75
    noise_weight: float = 1e5  # regulariser of optimised per-layer noise
    precision: str = "fp32"  # synthesis and LPIPS under autocast; w, the noise maps and the distances stay fp32


def learning_rate(step: int, settings: ProjectionSettings) -> float:
    t = step / settings.steps
    ramp = min(1.0, (1.0 - t) / settings.rampdown)
    ramp = 0.5 - 0.5 * math.cos(ramp * math.pi)
    return settings.lr * ramp * min(1.0, t / settings.rampup)


def noise_regularizer(noises: list[torch.Tensor]) -> torch.Tensor:
    """Per image: the spatial autocorrelation of its noise maps at every scale (the projector's regulariser)."""
    loss = 0.0
    for noise in noises:
        x = noise
        while True:
            for shift in (2, 3):
                loss = loss + (x * torch.roll(x, 1, dims=shift)).mean(dim=(1, 2, 3)).square()
            if x.shape[-1] <= 8:
                break
            x = torch.nn.functional.avg_pool2d(x, 2)
    return loss


def per_image_randn(streams: list[torch.Generator], shape: tuple[int, ...], device) -> torch.Tensor:
    """One draw of `shape` from each image's stream, stacked."""
    return torch.stack([torch.randn(shape, generator=stream) for stream in streams]).to(device)


@dataclasses.dataclass
class Projection:
    w: torch.Tensor
    images: torch.Tensor  # best reconstructions, [-1, 1]
    lpips: torch.Tensor  # per image, at the best step
    steps: int


def project(synthesis: Callable[..., torch.Tensor], targets: torch.Tensor, w_start: torch.Tensor,
            perceptual: Perceptual, settings: ProjectionSettings, streams: list[torch.Generator], w_spread: float,
            noise_shapes: list[tuple[int, ...]] | None = None,
            on_step: Callable[[int, float], None] | None = None) -> Projection:
    """Project a batch of targets ([-1, 1]), drawing image i's randomness from streams[i]; `synthesis(w)`
    renders images (noise fixed inside it; an Invertible's `render`).

    With `noise_shapes` (an Invertible's `noise_shapes()`), per-image noise maps of those shapes are
    optimised too; `synthesis` must then accept `noise=` maps.
    """
    if len(streams) != len(targets):
        raise ValueError(f"{len(targets)} targets need as many streams, got {len(streams)}")
    device = targets.device
    w = w_start.detach().clone().requires_grad_(True)
    params = [w]
    noises = None
    if noise_shapes is not None:
        noises = [per_image_randn(streams, shape, device).to(w.dtype).requires_grad_(True) for shape in noise_shapes]
        params += noises
    optimizer = torch.optim.Adam(params, betas=(0.9, 0.999), lr=settings.lr)
    update = Scaled(optimizer, settings.precision, device)
    with torch.no_grad():
        target_features = perceptual.features(targets)
    best = torch.full((len(targets),), math.inf, device=device, dtype=w.dtype)
    best_w, best_images = w.detach().clone(), targets.clone()
    for step in range(settings.steps):
        t = step / settings.steps
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, settings)
        scale = w_spread * settings.noise_factor * max(0.0, 1.0 - t / settings.noise_ramp) ** 2
        w_noisy = w + per_image_randn(streams, w.shape[1:], device).to(w.dtype) * scale
        with autocast(settings.precision, device):
            images = synthesis(w_noisy, noise=noises) if noises is not None else synthesis(w_noisy)
            distances = perceptual.paired(target_features, perceptual.features(images)).float()
        loss = distances.sum()
        if noises is not None:
            loss = loss + settings.noise_weight * noise_regularizer(noises).sum()
        optimizer.zero_grad(set_to_none=True)
        update.step(loss)
        if noises is not None:
            with torch.no_grad():
                for n in noises:
                    n.sub_(n.mean(dim=(1, 2, 3), keepdim=True))
                    n.div_(n.square().mean(dim=(1, 2, 3), keepdim=True).sqrt())
        with torch.no_grad():
            improved = distances.detach() < best
            best = torch.where(improved, distances.detach(), best)
            best_w[improved] = w_noisy.detach()[improved]
            best_images[improved] = images.detach()[improved].clamp(-1, 1)
        if on_step is not None:
            on_step(step, float(best.mean()))
    return Projection(best_w, best_images, best, settings.steps)
