"""The VQ-VAE-2 kind's options (its networks and codebooks, each node's PixelCNN prior), beside DP-SGD's, which it
shares with other kinds."""

from __future__ import annotations

import dataclasses

from fedcli.experiment.config import MAX_COUNT, ranged
from fedcli.experiment.panels import VQVAE2
from fedcli.generators.shared_options import DpOptions


@dataclasses.dataclass(frozen=True)
class VqVae2Options(DpOptions):
    vq_lr: float = ranged(4e-4, 0, 1, low_open=True, panel=VQVAE2, help=(
        "vqvae2: Adam learning rate of the VQ-VAE-2 and its priors."))
    vq_beta: float = ranged(0.25, 0, 100, panel=VQVAE2, help="vqvae2: commitment weight beta.")
    vq_decay: float = ranged(0.99, 0, 1, high_open=True, panel=VQVAE2, help="vqvae2: the codebooks' EMA decay.")
    vq_codebook: int = ranged(64, 2, 2**15, panel=VQVAE2, help="vqvae2: codes in each level's codebook.")
    vq_dim: int = ranged(32, 1, 4096, panel=VQVAE2, help="vqvae2: size of a code vector.")
    vq_channels: int = ranged(64, 2, 4096, panel=VQVAE2, help="vqvae2: feature maps of its encoders and decoders.")
    prior_iterations: int = ranged(0, 0, MAX_COUNT, why="0: no prior; the buffer is the decoded codes",
                                   panel=VQVAE2, help=(
        "vqvae2: steps of each node's class-conditional PixelCNN prior over its codes, whose samples are then the "
        "buffer; 0: no prior, the buffer is the decoded codes (reconstructions of real images)."))
    prior_channels: int = ranged(64, 1, 4096, panel=VQVAE2, help="vqvae2: feature maps of the prior.")
    prior_layers: int = ranged(4, 1, 64, panel=VQVAE2, help="vqvae2: gated masked layers of the prior.")


OPTIONS = VqVae2Options
