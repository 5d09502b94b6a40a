"""Options more than one generator kind reads, each declared once as a dataclass a kind's options inherit:
LPIPS (the privacy loss's and the audit's perceptual network) and DP-SGD. Light on purpose: the train-gan config
is composed from these before any kind's code is imported (fedcli/generators/config.py)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Literal

from fedcli.core.errors import UserError
from fedcli.experiment.config import MAX_COUNT, check_weights_file, number_or_keyword, option, ranged
from fedcli.experiment.panels import DP, PRIVACY_LOSS

LpipsNet = Literal["vgg", "alex"]
Off = Literal["off"]
DpNoise = Literal["keyed", "secure"]  # DP-SGD's noise from the run's seed, or from the OS (generators/secure_noise.py)


@dataclasses.dataclass(frozen=True)
class LpipsOptions:
    lpips_net: LpipsNet = option("alex", panel=PRIVACY_LOSS, help=(
        "LPIPS backbone: alex (quick default) or vgg (the study)."))
    lpips_weights: Path | None = option(None, panel=PRIVACY_LOSS, help=(
        "torchvision ImageNet weights of the LPIPS backbone \\[default: the torch hub cache, else a named random "
        "fallback]."))

    def check(self) -> None:
        check_weights_file(self, "lpips_weights")


@dataclasses.dataclass(frozen=True)
class DpOptions:
    dp_epsilon: float | Off | None = ranged(None, 0, MAX_COUNT, low_open=True, inf_allowed=True,
                                            why="inf: the DP code path without noise; off: no DP",
                                            parser=number_or_keyword, panel=DP, help=(
        "Train each discriminator with DP-SGD (Opacus: Poisson sampling, per-image clipping, Gaussian noise solved "
        "for this epsilon over the planned iterations, RDP accountant); the generator and buffer are then (epsilon, "
        "delta)-DP per training image. inf: the DP code path without noise; off: no DP. Turns off ADA, FID early "
        "stopping and snapshot choice, phase 2 and minibatch std; fake labels uniform. vqvae2: the chain hands on "
        "weights alone, the VQ-VAE-2 (gradient codebooks) and each node's prior train by DP-SGD under one guarantee, "
        "and only prior samples are released (needs --prior-iterations)."))
    dp_delta: float | None = ranged(None, 0, 1, low_open=True, high_open=True, why="default 1 / (10 N)",
                                    panel=DP, help=(
        "DP delta \\[default: 1 / (10 x the node's training images); at least 1 / N is refused]."))
    dp_max_grad_norm: float = ranged(1.0, 0, MAX_COUNT, low_open=True, panel=DP, help=(
        "DP clipping bound C: each real image's gradient over all discriminator (vqvae2: VQ-VAE-2, prior) parameters "
        "is clipped to this L2 norm."))
    dp_noise: DpNoise = option("keyed", panel=DP, help=(
        "Where DP-SGD's Gaussian noise comes from: keyed (a stream of the run's seed: reproducible, but private only "
        "while the seed, which config.json records, stays secret) or secure (ChaCha20 seeded by the OS's entropy, for "
        "deployment: the run is not reproducible). Needs --dp-epsilon."))

    def check(self) -> None:
        """Under --dp-epsilon every path from real images to what a node releases must be closed
        (generators/private.py); a kind refuses its own options that would open one."""
        if self.dp_epsilon == "off":
            object.__setattr__(self, "dp_epsilon", None)
        epsilon = self.dp_epsilon  # a number's range is checked with the others
        if epsilon is not None and (isinstance(epsilon, bool) or not isinstance(epsilon, (int, float))):
            raise UserError(f"--dp-epsilon must be a positive number, inf (the DP code path without noise) or off, "
                            f"got {epsilon!r}")
        if epsilon is None and self.dp_delta is not None:
            raise UserError("--dp-delta needs --dp-epsilon; give both or neither")
        if epsilon is None and self.dp_noise != "keyed":
            raise UserError(f"--dp-noise {self.dp_noise} needs --dp-epsilon: it is where DP-SGD's noise comes from; "
                            "add --dp-epsilon or drop --dp-noise")
