"""Reconstruction attacks on what a federation shares besides synthetic images: features and gradients.

Model inversion (Mahendran and Vedaldi 2015, as the journal version of FedReplay attacks its uploaded latents): the
attacker holds the encoder E (white box) and a shared feature z = E(x), and minimises ||E(x') - z||^2 + alpha TV(x')
over x' with AdamW. The study ran 20,000 iterations; fedcli caps them for the CPU and draws `restarts` starting
images instead, keeping for each image the restart whose feature loss ends lowest. The loss is a sum of per-image
terms and the encoder runs in eval mode, so an image's result does not depend on its batch.

Gradient inversion (Geiping et al. 2020, "Inverting gradients"): the attacker holds the model and one observed
gradient g of the loss on a batch, and minimises 1 - cos(grad L(f(x'), y), g) + alpha TV(x') over the batch x',
with Adam on the signed gradient, a step decay at 3/8, 5/8 and 7/8 of the iterations and x' kept in the image
range, as their code does. The labels are known to the attacker (their assumption); for one image they can be read
off the last layer's bias gradient (iDLG: the only negative entry), `labels_from_bias_gradient`. A layer y = W x + b
that sees the image itself gives it away exactly, whatever the optimiser: dL/dW = delta x^T and dL/db = delta, so
x = dL/dW[i] / dL/db[i] for any row i with delta_i != 0 (Phong et al. 2017), `linear_layer_input`.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn


@dataclasses.dataclass(frozen=True)
class InversionSettings:
    iterations: int = 2000  # the study: 20,000 (capped for the CPU)
    restarts: int = 2
    lr: float = 0.1
    tv: float = 1e-4  # alpha, the total-variation weight
    weight_decay: float = 0.0  # AdamW's, on x' (the model inversion's optimiser)


def total_variation(x: torch.Tensor) -> torch.Tensor:
    """Per image: the mean absolute difference between horizontal and between vertical neighbours."""
    return ((x[..., 1:, :] - x[..., :-1, :]).abs().flatten(1).mean(1)
            + (x[..., :, 1:] - x[..., :, :-1]).abs().flatten(1).mean(1))


def start_images(shape: tuple[int, ...], generator: torch.Generator) -> torch.Tensor:
    """A restart's starting images: uniform noise over the image range [-1, 1]."""
    return torch.rand(shape, generator=generator) * 2 - 1


def invert_features(encoder: nn.Module, features: torch.Tensor, image_shape: tuple[int, ...],
                    settings: InversionSettings, streams: list[torch.Generator],
                    on_step: Callable[[int], None] | None = None, batch_statistics: bool = False) -> torch.Tensor:
    """Images x' in [-1, 1] whose encodings match `features` (one per image), the best of the restarts per image;
    restart r of image i starts from a draw of streams[i]. The encoder is frozen (the attacker's copy) and in eval
    mode, or, with `batch_statistics`, in training mode with its BatchNorm normalising by the batch, as when the
    features were computed in a training step (the images are then inverted jointly, their running statistics
    left as they were)."""
    encoder = copy.deepcopy(encoder).train(batch_statistics).requires_grad_(False)
    if batch_statistics:
        for module in encoder.modules():
            if isinstance(module, nn.modules.batchnorm._BatchNorm):
                module.momentum = 0.0
    n = len(features)
    best, best_loss = torch.zeros((n, *image_shape)), torch.full((n,), float("inf"))
    for restart in range(settings.restarts):
        x = torch.stack([start_images(image_shape, stream) for stream in streams]).requires_grad_(True)
        optimizer = torch.optim.AdamW([x], lr=settings.lr, weight_decay=settings.weight_decay)
        for step in range(settings.iterations):
            optimizer.zero_grad(set_to_none=True)
            loss = feature_loss(encoder, x, features) + settings.tv * total_variation(x)
            loss.sum().backward()
            optimizer.step()
            with torch.no_grad():
                x.clamp_(-1, 1)
            if on_step is not None:
                on_step(restart * settings.iterations + step)
        with torch.no_grad():
            final = feature_loss(encoder, x, features)
            better = final < best_loss
            best[better], best_loss[better] = x.detach()[better], final[better]
    return best


def feature_loss(encoder: nn.Module, x: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
    return (encoder(x) - features).flatten(1).square().sum(1)


def batch_gradient(model: nn.Module, images: torch.Tensor, labels: torch.Tensor, create_graph: bool = False
                   ) -> list[torch.Tensor]:
    """The gradient of the mean cross-entropy of a batch with respect to every trainable parameter: what one local
    step at this batch size uses, and what a peer observes of it."""
    parameters = [p for p in model.parameters() if p.requires_grad]
    loss = F.cross_entropy(model(images), labels)
    return list(torch.autograd.grad(loss, parameters, create_graph=create_graph))


def gradient_mismatch(observed: list[torch.Tensor], candidate: list[torch.Tensor]) -> torch.Tensor:
    """1 - the cosine between the two gradients, every parameter flattened into one vector (Geiping et al.)."""
    dot = sum((a * b).sum() for a, b in zip(observed, candidate, strict=True))
    norms = (sum(a.square().sum() for a in observed).sqrt() * sum(b.square().sum() for b in candidate).sqrt())
    return 1 - dot / norms.clamp_min(1e-12)


def invert_gradient(model: nn.Module, observed: list[torch.Tensor], labels: torch.Tensor,
                    image_shape: tuple[int, ...], settings: InversionSettings, generator: torch.Generator,
                    on_step: Callable[[int], None] | None = None) -> torch.Tensor:
    """The batch x' (one image per label, in [-1, 1]) whose gradient points where `observed` does; the restart with
    the lowest final mismatch. The model stays in the mode the observed gradient was computed in (BatchNorm's batch
    statistics in training mode are part of what the attacker matches), and its parameters are left as they were."""
    observed = [g.detach() for g in observed]
    best, best_loss = None, float("inf")
    milestones = [round(settings.iterations * f) for f in (3 / 8, 5 / 8, 7 / 8)]
    for restart in range(settings.restarts):
        x = start_images((len(labels), *image_shape), generator).requires_grad_(True)
        optimizer = torch.optim.Adam([x], lr=settings.lr)
        schedule = torch.optim.lr_scheduler.MultiStepLR(optimizer, milestones, gamma=0.1)
        for step in range(settings.iterations):
            optimizer.zero_grad(set_to_none=True)
            loss = (gradient_mismatch(observed, batch_gradient(model, x, labels, create_graph=True))
                    + settings.tv * total_variation(x).mean())
            (x.grad,) = torch.autograd.grad(loss, [x])
            x.grad.sign_()
            optimizer.step()
            schedule.step()
            with torch.no_grad():
                x.clamp_(-1, 1)
            if on_step is not None:
                on_step(restart * settings.iterations + step)
        final = float(gradient_mismatch(observed, batch_gradient(model, x.detach(), labels)))
        if final < best_loss:
            best, best_loss = x.detach().clone(), final
    return best


def labels_from_bias_gradient(bias_gradient: torch.Tensor) -> torch.Tensor:
    """One image's label from the gradient of the last layer's bias: softmax(logits) - onehot(y) is negative only
    at y (Zhao et al. 2020, iDLG)."""
    return bias_gradient.argmin().reshape(1)


def linear_layer_input(weight_gradient: torch.Tensor, bias_gradient: torch.Tensor) -> torch.Tensor:
    """The single input of a fully connected layer from its weight and bias gradients: row i of dL/dW divided by
    dL/db[i], taken at the row with the largest |dL/db[i]| (the best conditioned)."""
    row = bias_gradient.abs().argmax()
    if float(bias_gradient[row]) == 0:
        raise ValueError("the bias gradient is zero: the layer's input cannot be read from it")
    return weight_gradient[row] / bias_gradient[row]
