"""A class-conditional autoregressive prior over VQ-VAE-2 codes (PixelCNN-style; van den Oord et al. 2016).

Two priors, as in VQ-VAE-2: one over the top codes given the class, one over the bottom codes given the class
and the top codes. Each is a stack of masked convolutions (the first excludes the current position, the rest
include it; gated tanh x sigmoid activations) whose every layer adds the class's embedding and, for the bottom,
a map computed from the top codes. Razavi et al. use PixelSNAIL-like priors with self-attention; this smaller
PixelCNN keeps the single masked stack's blind spot: a position never sees the row above beyond two columns to
its right (the first layer's reach; later layers extend it only diagonally), whatever the depth, so it models
less of each code's context than a gated PixelCNN's two stacks or PixelSNAIL would (a known limit, larger on
the 32x32 and 64x64 maps of 256 px images). Sampling draws one position at a time in raster order from the
caller's keyed stream.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import nn


class MaskedConv(nn.Conv2d):
    """A convolution that sees only positions before the centre in raster order (and the centre, for 'B')."""

    def __init__(self, kind: str, in_channels: int, out_channels: int, size: int):
        super().__init__(in_channels, out_channels, size, padding=size // 2)
        mask = torch.ones_like(self.weight)
        centre = size // 2
        mask[:, :, centre, centre + (kind == "B"):] = 0
        mask[:, :, centre + 1:] = 0
        self.register_buffer("mask", mask)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.conv2d(x, self.weight * self.mask, self.bias, padding=self.padding)


@dataclasses.dataclass(frozen=True)
class PriorArchitecture:
    codes: int  # the codebook's size
    num_classes: int
    channels: int = 64
    layers: int = 4
    condition_codes: int = 0  # the top codebook's size, for the bottom prior (0: the top prior)


class CodePrior(nn.Module):
    def __init__(self, arch: PriorArchitecture):
        super().__init__()
        self.arch = arch
        c, layers = arch.channels, arch.layers
        self.embed = nn.Embedding(arch.codes, c)
        self.first = MaskedConv("A", c, c, 5)
        self.gated = nn.ModuleList(MaskedConv("B", c, 2 * c, 3) for _ in range(layers))
        self.mix = nn.ModuleList(nn.Conv2d(c, c, 1) for _ in range(layers))
        self.classes = nn.Embedding(arch.num_classes, 2 * c * layers)
        self.condition = nn.Embedding(arch.condition_codes, c) if arch.condition_codes else None
        self.condition_conv = nn.Conv2d(c, 2 * c * layers, 3, padding=1) if arch.condition_codes else None
        self.out = nn.Sequential(nn.ReLU(), nn.Conv2d(c, arch.codes, 1))

    def forward(self, codes: torch.Tensor, labels: torch.Tensor, top: torch.Tensor | None = None) -> torch.Tensor:
        """Logits (B, codes, H, W) of each position's code given the earlier ones, the class and the top codes."""
        layers, c = self.arch.layers, self.arch.channels
        bias = self.classes(labels)[:, :, None, None]
        if self.condition is not None:
            side = codes.shape[-1]
            mapped = self.condition_conv(self.condition(top).permute(0, 3, 1, 2))
            bias = bias + F.interpolate(mapped, size=(side, side), mode="nearest")
        biases = bias.split(2 * c, dim=1)
        h = self.first(self.embed(codes).permute(0, 3, 1, 2))
        for i in range(layers):
            a, b = (self.gated[i](h) + biases[i]).chunk(2, dim=1)
            h = h + self.mix[i](torch.tanh(a) * torch.sigmoid(b))
        return self.out(h)

    def nll(self, codes: torch.Tensor, labels: torch.Tensor, top: torch.Tensor | None = None) -> torch.Tensor:
        """Mean negative log-likelihood per code (nats)."""
        return F.cross_entropy(self(codes, labels, top), codes)

    @torch.no_grad()
    def sample(self, labels: torch.Tensor, side: int, stream: torch.Generator, top: torch.Tensor | None = None
               ) -> torch.Tensor:
        """Codes (B, side, side) of `labels`, drawn position by position from `stream` (CPU)."""
        codes = torch.zeros(len(labels), side, side, dtype=torch.long, device=labels.device)
        for i in range(side):
            for j in range(side):
                probs = F.softmax(self(codes, labels, top)[:, :, i, j].double(), dim=1).cpu()
                codes[:, i, j] = torch.multinomial(probs, 1, generator=stream).flatten().to(labels.device)
        return codes
