"""Adaptive discriminator augmentation (after StyleGAN2-ADA), differentiable, on [-1, 1] tensors.

Each transform is applied to each image independently with probability p: horizontal flip,
90-degree rotation, integer translation (up to 1/8 of the side, reflected border), brightness
and contrast. D sees every real and fake image through it, so with small p it cannot leak into
G's outputs. p follows r_t = E[sign(D(real))]: above the target D is over-fitting, p rises.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def augment(x: torch.Tensor, p: float, generator: torch.Generator) -> torch.Tensor:
    if p <= 0:
        return x
    batch, _, height, width = x.shape
    device = x.device

    def chosen() -> torch.Tensor:
        return (torch.rand(batch, generator=generator, device=generator.device) < p).to(device).view(-1, 1, 1, 1)

    def draw(*shape, kind="rand", high=None) -> torch.Tensor:
        if kind == "int":
            return torch.randint(0, high, shape, generator=generator, device=generator.device).to(device)
        fn = torch.rand if kind == "rand" else torch.randn
        return fn(*shape, generator=generator, device=generator.device).to(device)

    x = torch.where(chosen(), x.flip(-1), x)
    mask, turns = chosen(), draw(batch, kind="int", high=4).view(-1, 1, 1, 1)
    for k in (1, 2, 3):
        x = torch.where(mask & (turns == k), torch.rot90(x, k, dims=(-2, -1)), x)
    x = torch.where(chosen(), translate(x, draw(batch, 2, kind="int", high=2 * (height // 8) + 1) - height // 8), x)
    x = x + chosen() * 0.2 * draw(batch, 1, 1, 1, kind="randn")
    scale = torch.exp2(0.5 * draw(batch, 1, 1, 1, kind="randn"))
    mean = x.mean(dim=(1, 2, 3), keepdim=True)
    return torch.where(chosen(), (x - mean) * scale + mean, x)


def translate(x: torch.Tensor, shifts: torch.Tensor) -> torch.Tensor:
    """Shift each image by integer (dy, dx), filling from a reflected border."""
    batch, _, height, width = x.shape
    m = int(shifts.abs().max().item()) if shifts.numel() else 0
    if m == 0:
        return x
    padded = F.pad(x, (m, m, m, m), mode="reflect")
    rows = torch.arange(height, device=x.device).view(1, -1) + m - shifts[:, :1]
    cols = torch.arange(width, device=x.device).view(1, -1) + m - shifts[:, 1:]
    index = torch.arange(batch, device=x.device).view(-1, 1, 1)
    return padded.permute(0, 2, 3, 1)[index, rows.unsqueeze(2), cols.unsqueeze(1)].permute(0, 3, 1, 2)


class AdaptiveAugment:
    """The augmentation probability and its controller."""

    def __init__(self, target: float = 0.6, speed_kimg: float = 20.0, interval: int = 4, p: float = 0.0):
        self.target, self.speed_kimg, self.interval, self.p = target, speed_kimg, interval, p
        self._signs: list[float] = []
        self._images = 0
        self.rt = math.nan

    def observe(self, real_logits: torch.Tensor) -> None:
        """Record sign(D(real)) of one D step; every `interval` steps, move p."""
        self._signs.append(float(torch.sign(real_logits.detach()).mean()))
        self._images += real_logits.shape[0]
        if len(self._signs) >= self.interval:
            self.rt = sum(self._signs) / len(self._signs)
            step = math.copysign(self._images / (self.speed_kimg * 1000), self.rt - self.target)
            self.p = min(max(self.p + step, 0.0), 1.0)
            self._signs, self._images = [], 0

    def state_dict(self) -> dict:
        return {"p": self.p, "rt": self.rt}

    def load_state_dict(self, state: dict) -> None:
        self.p, self.rt = state["p"], state["rt"]
        self._signs, self._images = [], 0
