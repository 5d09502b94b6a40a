"""A class-conditional StyleGAN2-style generator and discriminator in plain PyTorch.

After StyleGAN2(-ADA): a mapping network (z, class embedding) -> w; a synthesis network from a
learned 4x4 constant, with modulated/demodulated 3x3 convolutions, per-layer noise inputs and
skip-connected RGB outputs; equalized learning rate everywhere. Upsampling is bilinear rather
than the FIR filter of the custom CUDA ops, so it runs anywhere. The discriminator is residual,
with minibatch standard deviation and projection conditioning on the class embedding.

Each synthesis block takes its own w (style mixing trains with two); the generator tracks the mean
w of each class (`w_avg`), towards which truncation pulls a sample: per class rather than the
reference's single mean, because a conditional generator's mean over classes is no class at all.
"""

from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn.functional as F
from torch import nn

SQRT2 = math.sqrt(2.0)


@dataclasses.dataclass(frozen=True)
class Architecture:
    """Everything needed to rebuild the networks from `config.json`."""

    resolution: int
    channels: int  # image channels
    num_classes: int
    z_dim: int = 64
    w_dim: int = 64
    mapping_layers: int = 2
    channel_base: int = 2048  # feature maps at resolution r: min(channel_base // r, channel_max)
    channel_max: int = 128

    def __post_init__(self):
        r = self.resolution
        if r < 8 or r & (r - 1):
            raise ValueError(f"GAN resolution must be a power of two >= 8, got {r}")

    def width(self, res: int) -> int:
        return max(1, min(self.channel_base // res, self.channel_max))

    @property
    def block_resolutions(self) -> list[int]:
        return [2 ** i for i in range(3, int(math.log2(self.resolution)) + 1)]


class EqualLinear(nn.Module):
    def __init__(self, in_dim: int, out_dim: int, bias_init: float = 0.0, lr_mul: float = 1.0,
                 activate: bool = False):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(out_dim, in_dim) / lr_mul)
        self.bias = nn.Parameter(torch.full((out_dim,), float(bias_init)))
        self.scale = lr_mul / math.sqrt(in_dim)
        self.lr_mul = lr_mul
        self.activate = activate

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.linear(x, self.weight * self.scale, self.bias * self.lr_mul)
        return F.leaky_relu(x, 0.2) * SQRT2 if self.activate else x


class EqualConv2d(nn.Module):
    def __init__(self, in_ch: int, out_ch: int, kernel: int, bias: bool = True, activate: bool = True):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(out_ch, in_ch, kernel, kernel))
        self.bias = nn.Parameter(torch.zeros(out_ch)) if bias else None
        self.scale = 1 / math.sqrt(in_ch * kernel * kernel)
        self.padding = kernel // 2
        self.activate = activate

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.conv2d(x, self.weight * self.scale, self.bias, padding=self.padding)
        return F.leaky_relu(x, 0.2) * SQRT2 if self.activate else x


def normalize_2nd_moment(x: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    return x * (x.square().mean(dim=1, keepdim=True) + eps).rsqrt()


def modulated_conv2d(x: torch.Tensor, weight: torch.Tensor, styles: torch.Tensor, demodulate: bool = True
                     ) -> torch.Tensor:
    """Per-sample modulated convolution: weights scaled by the sample's styles, then (optionally)
    demodulated so each output map has unit variance for unit-variance input.

    Computed in StyleGAN2's non-fused form (scale the input, shared convolution, scale the
    output), which equals the per-sample weights exactly and runs as one batched convolution.
    """
    x = x * styles.view(*styles.shape, 1, 1)
    out = F.conv2d(x, weight, padding=weight.shape[-1] // 2)
    if demodulate:
        coefficients = (styles.square() @ weight.square().sum(dim=(2, 3)).T + 1e-8).rsqrt()
        out = out * coefficients.view(*coefficients.shape, 1, 1)
    return out


class MappingNetwork(nn.Module):
    def __init__(self, arch: Architecture, lr_mul: float = 0.01):
        super().__init__()
        self.embed = EqualLinear(arch.num_classes, arch.w_dim)
        dims = [arch.z_dim + arch.w_dim] + [arch.w_dim] * arch.mapping_layers
        self.layers = nn.Sequential(*[EqualLinear(a, b, lr_mul=lr_mul, activate=True) for a, b in zip(dims, dims[1:])])
        self.num_classes = arch.num_classes

    def forward(self, z: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        onehot = F.one_hot(labels, self.num_classes).to(z.dtype)
        x = torch.cat([normalize_2nd_moment(z), normalize_2nd_moment(self.embed(onehot))], dim=1)
        return self.layers(x)


class SynthesisLayer(nn.Module):
    def __init__(self, in_ch: int, out_ch: int, w_dim: int, resolution: int, up: bool = False):
        super().__init__()
        self.affine = EqualLinear(w_dim, in_ch, bias_init=1.0)
        self.weight = nn.Parameter(torch.randn(out_ch, in_ch, 3, 3))
        self.bias = nn.Parameter(torch.zeros(out_ch))
        self.noise_strength = nn.Parameter(torch.zeros([]))
        self.register_buffer("noise_const", torch.randn(resolution, resolution))
        self.up = up
        self.resolution = resolution

    def forward(self, x: torch.Tensor, w: torch.Tensor, noise_mode: str, generator: torch.Generator | None,
                noise_map: torch.Tensor | None = None) -> torch.Tensor:
        if self.up:
            x = F.interpolate(x, scale_factor=2, mode="bilinear", align_corners=False)
        x = modulated_conv2d(x, self.weight, self.affine(w))
        if noise_map is not None:  # given maps, e.g. optimised by the projector
            x = x + noise_map * self.noise_strength
        elif noise_mode == "random":
            r = self.resolution
            device = generator.device if generator is not None else x.device
            noise = torch.randn(x.shape[0], 1, r, r, generator=generator, device=device).to(x)
            x = x + noise * self.noise_strength
        elif noise_mode == "const":
            x = x + self.noise_const * self.noise_strength
        return F.leaky_relu(x + self.bias.view(1, -1, 1, 1), 0.2) * SQRT2


class ToRGB(nn.Module):
    def __init__(self, in_ch: int, out_ch: int, w_dim: int):
        super().__init__()
        self.affine = EqualLinear(w_dim, in_ch, bias_init=1.0)
        self.weight = nn.Parameter(torch.randn(out_ch, in_ch, 1, 1))
        self.bias = nn.Parameter(torch.zeros(out_ch))
        self.scale = 1 / math.sqrt(in_ch)

    def forward(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        x = modulated_conv2d(x, self.weight, self.affine(w) * self.scale, demodulate=False)
        return x + self.bias.view(1, -1, 1, 1)


class SynthesisBlock(nn.Module):
    """Two modulated convolutions at one resolution plus an RGB output added to the upsampled skip."""

    def __init__(self, in_ch: int, out_ch: int, arch: Architecture, resolution: int, first: bool):
        super().__init__()
        self.first = first
        if first:
            self.const = nn.Parameter(torch.randn(out_ch, 4, 4))
            self.conv1 = SynthesisLayer(out_ch, out_ch, arch.w_dim, 4)
        else:
            self.conv0 = SynthesisLayer(in_ch, out_ch, arch.w_dim, resolution, up=True)
            self.conv1 = SynthesisLayer(out_ch, out_ch, arch.w_dim, resolution)
        self.torgb = ToRGB(out_ch, arch.channels, arch.w_dim)

    def layers(self) -> list[SynthesisLayer]:
        return [self.conv1] if self.first else [self.conv0, self.conv1]

    def forward(self, x, img, w, noise_mode, generator, noise_maps=None):
        maps = iter(noise_maps or [None] * len(self.layers()))
        if self.first:
            x = self.const.unsqueeze(0).expand(w.shape[0], -1, -1, -1)
        else:
            x = self.conv0(x, w, noise_mode, generator, next(maps))
        x = self.conv1(x, w, noise_mode, generator, next(maps))
        y = self.torgb(x, w)
        if img is not None:
            y = y + F.interpolate(img, scale_factor=2, mode="bilinear", align_corners=False)
        return x, y


MEAN_SAMPLES = 1000  # mapped z per class for the class's mean w, the projection's start


@torch.no_grad()
def class_mean_w(generator, z_dim: int, classes: list[int], samples: int, stream: torch.Generator
                 ) -> tuple[dict, float]:
    """Mean w per class from `samples` z of size `z_dim` through `generator.mapping` each, and the spread of
    w (for the projector's exploration noise)."""
    means, spreads = {}, []
    device = next(generator.parameters()).device
    for c in classes:
        z = torch.randn(samples, z_dim, generator=stream).to(device)
        w = generator.mapping(z, torch.full((samples,), c, dtype=torch.long, device=device))
        means[c] = w.mean(dim=0)
        spreads.append(((w - means[c]).square().sum(dim=1).mean()).sqrt().item())
    return means, sum(spreads) / len(spreads)


def class_mean_start(generator, z_dim: int, labels: torch.Tensor, stream: torch.Generator
                     ) -> tuple[torch.Tensor, float]:
    """Each image's starting w for the audit's projection: its class's mean w."""
    means, spread = class_mean_w(generator, z_dim, sorted(set(labels.tolist())), MEAN_SAMPLES, stream)
    return torch.stack([means[int(c)] for c in labels]), spread


class Generator(nn.Module):
    """The StyleGAN kind's generator: a Sampler and Invertible (fedcli/generators/protocol.py) in W space."""

    def __init__(self, arch: Architecture):
        super().__init__()
        self.arch = arch
        self.mapping = MappingNetwork(arch)
        resolutions = [4, *arch.block_resolutions]
        self.blocks = nn.ModuleList(
            SynthesisBlock(arch.width(resolutions[max(i - 1, 0)]), arch.width(r), arch, r, first=(i == 0))
            for i, r in enumerate(resolutions)
        )
        self.register_buffer("w_avg", torch.zeros(arch.num_classes, arch.w_dim))
        self.register_buffer("w_updates", torch.zeros(arch.num_classes))

    @property
    def num_ws(self) -> int:
        return len(self.blocks)

    @torch.no_grad()
    def track_w_avg(self, w: torch.Tensor, labels: torch.Tensor, beta: float = 0.995) -> None:
        """Move each class's mean w towards the batch's mean w of that class: a plain running mean over
        the first 1 / (1 - beta) updates, then an EMA, so a short run's mean is not pulled towards 0."""
        sums = torch.zeros_like(self.w_avg).index_add_(0, labels, w.detach())
        counts = torch.bincount(labels, minlength=self.arch.num_classes)
        seen = counts > 0
        rate = (1 / (self.w_updates[seen] + 1)).clamp(min=1 - beta).unsqueeze(1)
        self.w_avg[seen] = self.w_avg[seen].lerp(sums[seen] / counts[seen].unsqueeze(1), rate)
        self.w_updates[seen] += 1

    def styles(self, z: torch.Tensor, labels: torch.Tensor, truncation: float = 1.0) -> torch.Tensor:
        """w for (z, label), pulled towards the class's mean w by `truncation` (1: none, 0: the mean)."""
        w = self.mapping(z, labels)
        return w if truncation == 1 else self.w_avg[labels].lerp(w, truncation)

    @property
    def noise_layers(self) -> list[SynthesisLayer]:
        return [layer for block in self.blocks for layer in block.layers()]

    def synthesis(self, w: torch.Tensor, noise_mode: str = "random", generator: torch.Generator | None = None,
                  noise: list[torch.Tensor] | None = None) -> torch.Tensor:
        """Images from w: (B, w_dim), one w for every block (the audit projects in this W space), or
        (B, num_ws, w_dim), one per block; `noise` gives every layer's noise map explicitly (in
        `noise_layers` order)."""
        x = img = None
        maps = iter(noise) if noise is not None else None
        for i, block in enumerate(self.blocks):
            block_maps = [next(maps) for _ in block.layers()] if maps is not None else None
            x, img = block(x, img, w if w.dim() == 2 else w[:, i], noise_mode, generator, block_maps)
        return img

    def forward(self, z: torch.Tensor, labels: torch.Tensor, noise_mode: str = "random",
                generator: torch.Generator | None = None, truncation: float = 1.0) -> torch.Tensor:
        return self.synthesis(self.styles(z, labels, truncation), noise_mode, generator)

    def sample(self, labels: torch.Tensor, stream: torch.Generator, truncation: float = 1.0) -> torch.Tensor:
        z = torch.randn(len(labels), self.arch.z_dim, generator=stream)
        return self(z.to(labels.device), labels, generator=stream, truncation=truncation)

    def start(self, labels: torch.Tensor, stream: torch.Generator) -> tuple[torch.Tensor, float]:
        return class_mean_start(self, self.arch.z_dim, labels, stream)

    def render(self, latents: torch.Tensor, noise: list[torch.Tensor] | None = None) -> torch.Tensor:
        """Images from one w per image, with the layers' fixed noise or the given maps."""
        return self.synthesis(latents, noise_mode="const", noise=noise)

    def noise_shapes(self) -> list[tuple[int, ...]]:
        return [(1, layer.resolution, layer.resolution) for layer in self.noise_layers]


class DiscriminatorBlock(nn.Module):
    def __init__(self, in_ch: int, out_ch: int):
        super().__init__()
        self.conv0 = EqualConv2d(in_ch, in_ch, 3)
        self.conv1 = EqualConv2d(in_ch, out_ch, 3)
        self.skip = EqualConv2d(in_ch, out_ch, 1, bias=False, activate=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        skip = self.skip(F.avg_pool2d(x, 2))
        x = F.avg_pool2d(self.conv1(self.conv0(x)), 2)
        return (skip + x) / SQRT2


class Discriminator(nn.Module):
    def __init__(self, arch: Architecture, mbstd_group: int = 4):
        super().__init__()
        self.arch = arch
        top = arch.resolution
        self.fromrgb = EqualConv2d(arch.channels, arch.width(top), 1)
        self.blocks = nn.Sequential(*[DiscriminatorBlock(arch.width(r), arch.width(r // 2))
                                      for r in reversed(arch.block_resolutions)])
        c4 = arch.width(4)
        self.mbstd_group = mbstd_group
        self.conv = EqualConv2d(c4 + 1, c4, 3)
        self.fc = EqualLinear(c4 * 16, c4, activate=True)
        self.out = EqualLinear(c4, 1)
        self.embed = EqualLinear(arch.num_classes, c4)  # projection conditioning
        self.num_classes = arch.num_classes

    def minibatch_std(self, x: torch.Tensor) -> torch.Tensor:
        batch, ch, h, w = x.shape
        group = min(self.mbstd_group, batch)
        while batch % group:
            group -= 1
        y = x.reshape(group, -1, ch, h, w)
        y = (y - y.mean(dim=0)).square().mean(dim=0).add(1e-8).sqrt().mean(dim=(1, 2, 3))
        y = y.reshape(-1, 1, 1, 1).repeat(group, 1, h, w)
        return torch.cat([x, y], dim=1)

    def forward(self, img: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        x = self.blocks(self.fromrgb(img))
        x = self.conv(self.minibatch_std(x))
        h = self.fc(x.flatten(1))
        # a comparison, not F.one_hot, so per-sample gradients can vmap over the batch (DP training)
        onehot = (labels.unsqueeze(-1) == torch.arange(self.num_classes, device=labels.device)).to(h.dtype)
        projection = (normalize_2nd_moment(self.embed(onehot)) * h).sum(dim=1, keepdim=True) / math.sqrt(h.shape[1])
        return (self.out(h) + projection).squeeze(1)
