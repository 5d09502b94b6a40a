"""LPIPS (from the `lpips` package) with features computed once per image and all pairwise
distances from them, plus offline handling of its ImageNet backbone.

LPIPS(x, y) = sum over layers l of mean over positions of sum_c w_lc (f_l(x) - f_l(y))^2 with
channel-normalised features f_l. Expanding the square turns the b x b distance matrix into two
norms and one matrix product per layer, so b + b forward passes serve all b^2 pairs.

The backbone's ImageNet weights come from `--lpips-weights` or the torch hub cache. When absent,
the same architecture with a fixed random initialisation is used, named `<net>-random`: a
random backbone is not a perceptual metric, so every number made with it is uncalibrated.
"""

from __future__ import annotations

import contextlib
import io
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from fedcli.core import console
from fedcli.core.errors import UserError
from fedcli.core.rng import stream_seed
from fedcli.core.weights import BACKBONES, hub_checkpoint, load_state
from fedcli.experiment.artifact_kinds import file_sha256

# torchvision's file names for the ImageNet backbones, as torch.hub caches them
MIN_SIZE = 32
HUB_FILES = {net: BACKBONES[net].filename for net in ("vgg", "alex")}
_warned: set[str] = set()


def warn_fallback(name: str, message: str) -> None:
    if name not in _warned:
        _warned.add(name)
        console.warn(message)


class Perceptual(nn.Module):
    """Frozen LPIPS network; inputs are images in [-1, 1] with 1 or 3 channels."""

    def __init__(self, net: str = "vgg", weights: Path | None = None, random_seed: int | None = None):
        """`random_seed`: a random backbone from that seed whatever weights exist (the audit's
        independent network, `<net>-random-<seed>`); otherwise ImageNet weights when present."""
        super().__init__()
        import lpips

        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(stream_seed(random_seed or 0, "lpips-random-backbone", net))
                model = lpips.LPIPS(net=net, pretrained=True, pnet_rand=True, verbose=False)
        source = None if random_seed is not None else weights or hub_checkpoint(HUB_FILES[net])
        self.net = net
        self.weights_sha256 = None  # of the backbone's weights file, so the audit can check it uses the same
        if random_seed is not None:
            self.name, self.calibrated = f"{net}-random-{random_seed}", False
        elif source is not None:
            self._load_backbone(model, load_state(Path(source), "LPIPS backbone weights"), net)
            self.name, self.calibrated, self.weights_sha256 = net, True, file_sha256(Path(source))
        else:
            self.name, self.calibrated = f"{net}-random", False
            warn_fallback(self.name, f"no ImageNet weights for the LPIPS {net} backbone (fedcli weights fetch {net} "
                          f"puts {HUB_FILES[net]} in the torch hub cache, or pass --lpips-weights); using a fixed "
                          f"random {net}, named '{self.name}': its distances are uncalibrated")
        self.model = model.eval().requires_grad_(False)
        self.lin_weights = [lin.model[-1].weight.detach().flatten() for lin in model.lins]

    def record(self) -> dict:
        """What train-gan records of the LPIPS network a generator was trained against: the audit checks that
        it measures in the same one."""
        return {"net": self.net, "name": self.name, "calibrated": self.calibrated, "weights_sha256": self.weights_sha256}

    @staticmethod
    def _load_backbone(model, state: dict, net: str) -> None:
        """Copy torchvision `features.<i>.*` tensors into lpips' slices, which hold the same modules."""
        target = model.net.state_dict()
        index_to_key = {key.split(".")[1]: key.split(".")[0] for key in target}
        mapped = {}
        for key, value in state.items():
            parts = key.split(".")
            if parts[0] == "features" and parts[1] in index_to_key:
                mapped[f"{index_to_key[parts[1]]}.{parts[1]}.{parts[2]}"] = value
        missing = set(target) - set(mapped)
        if missing:
            raise UserError(f"LPIPS backbone weights do not fit torchvision's {net} (missing {sorted(missing)[0]})")
        model.net.load_state_dict(mapped)

    def _backbone(self, x: torch.Tensor) -> list[torch.Tensor]:
        """Backbone activations; grayscale is repeated to RGB and images under 32 px are upsampled
        (AlexNet's strides need at least that)."""
        if x.shape[1] == 1:
            x = x.expand(-1, 3, -1, -1)
        if x.shape[-1] < MIN_SIZE:
            x = F.interpolate(x, size=(MIN_SIZE, MIN_SIZE), mode="bilinear", align_corners=False)
        return self.model.net(self.model.scaling_layer(x))

    def features(self, x: torch.Tensor) -> list[torch.Tensor]:
        outputs = self._backbone(x)
        return [f / (f.square().sum(dim=1, keepdim=True).sqrt() + 1e-10) for f in outputs]

    @torch.no_grad()
    def features_of(self, images: torch.Tensor, chunk: int = 256) -> list[torch.Tensor]:
        """`features` of many images, computed `chunk` at a time and joined per layer."""
        parts = [self.features(images[i:i + chunk]) for i in range(0, len(images), chunk)]
        return [torch.cat(layer) for layer in zip(*parts)]

    def pairwise(self, a: list[torch.Tensor], b: list[torch.Tensor]) -> torch.Tensor:
        """(len(a), len(b)) LPIPS distances between every feature set in a and every one in b."""
        total = None
        for fa, fb, w in zip(a, b, self.lin_weights):
            w = w.to(fa.dtype).view(1, -1, 1, 1)
            positions = fa.shape[2] * fa.shape[3]
            norm_a = (fa.square() * w).sum(dim=1).mean(dim=(1, 2))
            norm_b = (fb.square() * w).sum(dim=1).mean(dim=(1, 2))
            cross = (fa * w).flatten(1) @ fb.flatten(1).T / positions
            layer = norm_a[:, None] + norm_b[None, :] - 2 * cross
            total = layer if total is None else total + layer
        return total.clamp_min(0)

    def paired(self, a: list[torch.Tensor], b: list[torch.Tensor]) -> torch.Tensor:
        """LPIPS between matching feature sets a[i], b[i] (features computed once, e.g. of fixed targets)."""
        total = 0
        for fa, fb, w in zip(a, b, self.lin_weights):
            total = total + ((fa - fb).square() * w.view(1, -1, 1, 1)).sum(dim=1).mean(dim=(1, 2))
        return total

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Distances between matching pairs x[i], y[i]."""
        return self.paired(self.features(x), self.features(y))
