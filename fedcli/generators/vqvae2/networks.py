"""The VQ-VAE-2 (Razavi et al. 2019): two levels of codes, the bottom at 1/4 of the image side and the top at 1/8 (at
256 px the generative-replay study's 64x64 and 32x32), each quantised with an EMA codebook
(fedcli/generators/vqvae2/quantizer.py; a gradient codebook under DP). The top level sees the bottom encoder's features;
the
bottom level quantises them together with the top's decoding, so the top carries global structure and the bottom
the detail the top leaves out. The decoder reads both (the top's codes upsampled). The network is not
class-conditional: the labels travel beside the codes, and the prior (fedcli/generators/vqvae2/prior.py) is what draws
codes
of a class.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import nn

from fedcli.generators.vqvae2.codes import CodeShape, NodeCodes
from fedcli.generators.vqvae2.quantizer import Quantizer


@dataclasses.dataclass(frozen=True)
class VqArchitecture:
    resolution: int
    channels: int
    num_classes: int
    hidden: int = 64  # feature maps of the encoders and decoders
    codes: int = 64  # entries of each level's codebook
    dim: int = 32  # a code vector's size
    res_blocks: int = 2
    decay: float = 0.99
    codebook: str = "ema"  # or "gradient" (fedcli/generators/vqvae2/quantizer.py), as DP training needs

    def __post_init__(self) -> None:
        if self.resolution < 16 or self.resolution % 8:
            raise ValueError(f"{self.resolution} px is not a multiple of 8 of at least 16")

    @property
    def bottom_side(self) -> int:
        return self.resolution // 4

    @property
    def top_side(self) -> int:
        return self.resolution // 8


class ResBlock(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.body = nn.Sequential(nn.ReLU(), nn.Conv2d(channels, channels // 2, 3, padding=1), nn.ReLU(),
                                  nn.Conv2d(channels // 2, channels, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.body(x)


def encoder(in_channels: int, hidden: int, blocks: int, stride: int) -> nn.Sequential:
    """Down by `stride` (4 or 2), then residual blocks."""
    if stride == 4:
        down = [nn.Conv2d(in_channels, hidden // 2, 4, 2, 1), nn.ReLU(), nn.Conv2d(hidden // 2, hidden, 4, 2, 1),
                nn.ReLU(), nn.Conv2d(hidden, hidden, 3, padding=1)]
    else:
        down = [nn.Conv2d(in_channels, hidden // 2, 4, 2, 1), nn.ReLU(), nn.Conv2d(hidden // 2, hidden, 3, padding=1)]
    return nn.Sequential(*down, *(ResBlock(hidden) for _ in range(blocks)), nn.ReLU())


def decoder(in_channels: int, out_channels: int, hidden: int, blocks: int, stride: int) -> nn.Sequential:
    """Residual blocks, then up by `stride` (4 or 2)."""
    if stride == 4:
        up = [nn.ConvTranspose2d(hidden, hidden // 2, 4, 2, 1), nn.ReLU(),
              nn.ConvTranspose2d(hidden // 2, out_channels, 4, 2, 1)]
    else:
        up = [nn.ConvTranspose2d(hidden, out_channels, 4, 2, 1)]
    return nn.Sequential(nn.Conv2d(in_channels, hidden, 3, padding=1), *(ResBlock(hidden) for _ in range(blocks)),
                         nn.ReLU(), *up)


class VqVae2(nn.Module):
    def __init__(self, arch: VqArchitecture):
        super().__init__()
        self.arch = arch
        h, d, r = arch.hidden, arch.dim, arch.res_blocks
        self.enc_b = encoder(arch.channels, h, r, 4)
        self.enc_t = encoder(h, h, r, 2)
        self.to_top = nn.Conv2d(h, d, 1)
        self.quant_t = Quantizer(d, arch.codes, arch.decay, learned=arch.codebook)
        self.dec_t = decoder(d, d, h, r, 2)
        self.to_bottom = nn.Conv2d(h + d, d, 1)
        self.quant_b = Quantizer(d, arch.codes, arch.decay, learned=arch.codebook)
        self.up_t = nn.ConvTranspose2d(d, d, 4, 2, 1)
        self.dec = decoder(2 * d, arch.channels, h, r, 4)

    def forward(self, x: torch.Tensor, stream: torch.Generator | None = None
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, tuple[torch.Tensor, torch.Tensor]]:
        """x in [-1, 1] -> (reconstruction, both levels' commitment loss summed, their codebook loss summed (None
        for EMA codebooks), (top codes, bottom codes))."""
        q_t, q_b, commitment, codebook, codes = self.quantise(x, stream)
        return self.decode_vectors(q_t, q_b), commitment, codebook, codes

    def quantise(self, x: torch.Tensor, stream: torch.Generator | None = None):
        h_b = self.enc_b(x)
        h_t = self.enc_t(h_b)
        q_t, codes_t, commit_t, book_t = self.quant_t(self.to_top(h_t), stream)
        q_b, codes_b, commit_b, book_b = self.quant_b(self.to_bottom(torch.cat([h_b, self.dec_t(q_t)], 1)), stream)
        codebook = None if book_t is None else book_t + book_b
        return q_t, q_b, commit_t + commit_b, codebook, (codes_t, codes_b)

    def decode_vectors(self, q_t: torch.Tensor, q_b: torch.Tensor) -> torch.Tensor:
        return self.dec(torch.cat([self.up_t(q_t), q_b], 1))

    @torch.no_grad()
    def encode(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Images in [-1, 1] -> (top codes, bottom codes), in eval mode (the codebook does not move)."""
        training = self.training
        self.eval()
        *_, codes = self.quantise(images)
        self.train(training)
        return codes

    @torch.no_grad()
    def decode(self, top: torch.Tensor, bottom: torch.Tensor) -> torch.Tensor:
        """Codes -> images in [-1, 1]."""
        return self.decode_vectors(self.quant_t.lookup(top), self.quant_b.lookup(bottom)).clamp(-1, 1)


def objective(outputs: tuple, x: torch.Tensor, beta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """From a forward pass on `x`: (||x - D(e)||^2 [+ ||sg[E(x)] - e||^2, a gradient codebook's term; an EMA
    codebook's is its update] + beta ||sg[e] - E(x)||^2, the reconstruction error)."""
    reconstruction, commitment, codebook, _ = outputs
    mse = F.mse_loss(reconstruction, x)
    return (mse if codebook is None else mse + codebook) + beta * commitment, mse


def loss(model: VqVae2, x: torch.Tensor, beta: float, stream: torch.Generator | None = None
         ) -> tuple[torch.Tensor, dict[str, float], tuple[torch.Tensor, torch.Tensor]]:
    """The objective on a batch, its parts, and the codes."""
    outputs = model(x, stream)
    total, mse = objective(outputs, x, beta)
    return total, {"mse": mse.item(), "commitment": outputs[1].item()}, outputs[3]


def code_shape(arch: VqArchitecture) -> CodeShape:
    return CodeShape(arch.top_side, arch.bottom_side, arch.codes, arch.num_classes)


def encode_all(model: VqVae2, images: torch.Tensor, labels: torch.Tensor, device: str) -> NodeCodes:
    tops, bottoms = [], []
    for start in range(0, len(images), 256):
        top, bottom = model.encode(images[start:start + 256].to(device))
        tops.append(top.cpu())
        bottoms.append(bottom.cpu())
    return NodeCodes(torch.cat(tops), torch.cat(bottoms), labels.clone())


def decode_all(model: VqVae2, codes: NodeCodes, device: str) -> torch.Tensor:
    return torch.cat([model.decode(codes.top[s:s + 256].to(device), codes.bottom[s:s + 256].to(device)).cpu()
                      for s in range(0, len(codes), 256)]) if len(codes) else torch.empty(0)
