"""Vector quantisation with an EMA codebook (van den Oord et al. 2017, appendix A.1; Razavi et al. 2019), or
a gradient codebook (below).

An EMA codebook is not trained by gradient: each code moves to the exponential moving average of the encoder
outputs assigned to it (decay `decay`, Laplace-smoothed counts), and the encoder is held to its codes by the
commitment loss beta ||sg[e] - E(x)||^2. The quantised output passes the decoder's gradient straight through
to the encoder. A code whose EMA count (before smoothing) falls below `dead_below`, chosen less than about once
a step of late, restarts at an encoder output of the current batch, drawn from the trainer's keyed stream. The
counts start at 1, so every code the first batch leaves unused restarts at step 1 (a data-dependent
initialisation); a restarted code left unused again restarts again at the next step.

`learned="gradient"` is the paper's other codebook (its equation 3): the codes are parameters trained by the
codebook loss ||sg[E(x)] - e||^2, with no EMA and no restarts, so every data-dependent update of the codebook
is a gradient. DP-SGD privatises gradients only, so a DP VQ-VAE-2 (fedcli/generators/vqvae2/kind.py) learns its codebook
so.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


CODEBOOKS = ("ema", "gradient")


class Quantizer(nn.Module):
    def __init__(self, dim: int, codes: int, decay: float = 0.99, eps: float = 1e-5, dead_below: float = 1.0,
                 learned: str = "ema"):
        super().__init__()
        self.dim, self.codes, self.decay, self.eps, self.dead_below = dim, codes, decay, eps, dead_below
        if learned not in CODEBOOKS:
            raise ValueError(f"a codebook is learned by one of {', '.join(CODEBOOKS)}, not {learned!r}")
        self.learned = learned
        embed = torch.randn(codes, dim) * dim ** -0.5  # under the caller's seeded initialisation
        if learned == "gradient":
            self.embed = nn.Parameter(embed)
        else:
            self.register_buffer("embed", embed)
            self.register_buffer("cluster_size", torch.ones(codes))
            self.register_buffer("embed_sum", embed.clone())
        self.restarted = 0  # codes restarted by the last update

    def nearest(self, flat: torch.Tensor) -> torch.Tensor:
        """Each row's nearest code (squared Euclidean distance)."""
        distance = flat.pow(2).sum(1, keepdim=True) - 2 * flat @ self.embed.t() + self.embed.pow(2).sum(1)[None]
        return distance.argmin(1)

    def forward(self, z: torch.Tensor, stream: torch.Generator | None = None
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """z (B, D, H, W) -> (straight-through quantised z, codes (B, H, W), commitment ||sg[e] - z||^2, the
        codebook loss ||sg[z] - e||^2 of a gradient codebook, else None). In training mode an EMA codebook takes
        one step (dead codes restart from `stream`). Always fp32, also under autocast: the nearest code is an argmin
        over distances that bf16 would tie, and the EMA's running sums need fp32's mantissa."""
        with torch.autocast(z.device.type, enabled=False):
            return self._quantise(z.float(), stream)

    def _quantise(self, z: torch.Tensor, stream: torch.Generator | None
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
        b, d, h, w = z.shape
        flat = z.permute(0, 2, 3, 1).reshape(-1, d)
        codes = self.nearest(flat.detach())
        quantised = self.embed[codes]
        codebook = None
        if self.learned == "gradient":
            codebook = F.mse_loss(quantised, flat.detach())
        elif self.training:
            self.ema_update(flat.detach(), codes, stream)
        commitment = F.mse_loss(flat, quantised.detach())
        out = flat + (quantised - flat).detach()  # straight through: the decoder's gradient reaches z as it is
        return out.view(b, h, w, d).permute(0, 3, 1, 2), codes.view(b, h, w), commitment, codebook

    @torch.no_grad()
    def ema_update(self, flat: torch.Tensor, codes: torch.Tensor, stream: torch.Generator | None) -> None:
        onehot = F.one_hot(codes, self.codes).type(flat.dtype)
        self.cluster_size.mul_(self.decay).add_(onehot.sum(0), alpha=1 - self.decay)
        self.embed_sum.mul_(self.decay).add_(onehot.t() @ flat, alpha=1 - self.decay)
        n = self.cluster_size.sum()
        smoothed = (self.cluster_size + self.eps) / (n + self.codes * self.eps) * n
        self.embed.copy_(self.embed_sum / smoothed[:, None])
        self.restarted = self.restart_dead(flat, stream) if stream is not None else 0

    @torch.no_grad()
    def restart_dead(self, flat: torch.Tensor, stream: torch.Generator) -> int:
        """Codes whose count fell below `dead_below` restart at encoder outputs of this batch, drawn from `stream`,
        with count 1."""
        dead = (self.cluster_size < self.dead_below).nonzero().flatten()
        if not len(dead):
            return 0
        pick = torch.randint(0, len(flat), (len(dead),), generator=stream).to(flat.device)
        self.embed[dead] = flat[pick]
        self.embed_sum[dead] = flat[pick]
        self.cluster_size[dead] = 1.0
        return len(dead)

    def lookup(self, codes: torch.Tensor) -> torch.Tensor:
        """Codes (B, H, W) -> their vectors (B, D, H, W)."""
        return self.embed[codes].permute(0, 3, 1, 2)


def perplexity(codes: torch.Tensor, size: int) -> float:
    """exp(entropy) of the codes' usage: how many codes are used, as if equally (1 to `size`)."""
    p = torch.bincount(codes.flatten(), minlength=size).double()
    p = p / p.sum()
    return float(torch.exp(-(p[p > 0] * p[p > 0].log()).sum()))
