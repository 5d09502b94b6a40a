"""Fréchet distance between real and generated images in a feature space.

Calibrated, named `inception-v3-compat`: torch-fidelity's FeatureExtractorInceptionV3, the Inception-v3
ported from TensorFlow's FID code whose weights pytorch-fid, torch-fidelity, torchmetrics and published
FIDs use, with TensorFlow 1's bilinear resize to 299 px (torchmetrics' at antialias=False), read at its
2048 pool features from the images as uint8 RGB (grey repeated), with weights from `--fid-weights` or
the file `fedcli weights fetch inception` puts in the torch hub cache. When present it is the one FID
of train-gan: snapshot selection, stopping, phase 2's limit and the reported numbers, so the number
that chose a snapshot is the number reported, computed as published FIDs are (at `--fid-images`
images, not their 50,000: FID's bias falls as the images grow, so compare at equal counts).
Otherwise the penultimate features of a small CNN trained on the node's own training images, named
`cnn-node` (the domain-classifier FID used for digit GANs, where Inception's ImageNet features say
little): it sees the classes and the scanner, it is not the LPIPS network the privacy loss pushes
against (so L_PP cannot move FID by moving that network's features), and its 128 features are few
enough for 256 images to estimate their covariance. Uncalibrated, and read in units of the real
features' spread: comparable within a node's run (selection and stopping), not with published FIDs
or across nodes.

The distance, in float64, takes Tr((S1 S2)^(1/2)) as the sum of the singular values of F1 F2^T, where
F^T F = S (the centred features over sqrt(n - 1), or their QR's R with more images than features):
the factored form of Mathiasen and Hvilshøj 2020 (FastFID), the same number pytorch-fid takes with
scipy's sqrtm and torchmetrics and torch-fidelity from the eigenvalues of S1 S2 (tested against
torch-fidelity). Those two work on the singular 2048 x 2048 product that fewer images than features
leave: sqrtm can fail (hence a retry), and the eigenvalues' rounding noise, square-rooted, adds up
(identical sets scored 2e-6 to 4e-6 x Tr(S) below 0). Here noise stays at rounding size, identical sets
give 0, and 512 images cost one 512 x 512 SVD instead of an eigendecomposition of 2048 x 2048.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from fedcli.core.errors import UserError
from fedcli.core.weights import BACKBONES, hub_checkpoint, load_state
from fedcli.generators.buffer import to_uint8
from fedcli.generators.perceptual import warn_fallback

TF_INCEPTION = "inception-v3-compat"  # torch-fidelity's and torchmetrics' name for the TF-ported network
CLASSIFIER_NAME = "cnn-node"


class FeatureSpace:
    """`embed(images)`: features of float images in [-1, 1], without gradients."""

    def __init__(self, embed: Callable[[torch.Tensor], torch.Tensor], name: str, calibrated: bool):
        self._embed, self.name, self.calibrated = embed, name, calibrated

    @torch.no_grad()
    def embed(self, images: torch.Tensor) -> torch.Tensor:
        return self._embed(images)


def inception_space(weights: Path | None, device: str = "cpu") -> FeatureSpace | None:
    """The TF-ported Inception from `weights` or the hub cache; None (and a warning) when absent."""
    filename = BACKBONES["inception"].filename
    source = weights or hub_checkpoint(filename)
    if source is None:
        warn_fallback("fid-classifier", f"no Inception weights for FID (fedcli weights fetch inception puts "
                      f"{filename} in the torch hub cache, or pass --fid-weights); FID uses the features "
                      f"of a small CNN trained on each node's training images, named 'fid[{CLASSIFIER_NAME}]', "
                      "uncalibrated")
        return None
    state = load_state(Path(source), "Inception weights")
    try:
        net = tf_inception(state)
    except RuntimeError as exc:  # load_state_dict's missing, unexpected or misshapen keys
        detail = str(exc).strip().splitlines()[-1].strip()[:160]
        raise UserError(f"Inception weights {source} are not torch-fidelity's TF-ported Inception-v3 ({detail}); "
                        f"give {filename} (fedcli weights fetch inception)") from exc
    net = net.to(device)

    def embed(images: torch.Tensor) -> torch.Tensor:
        rgb = images.expand(-1, 3, -1, -1) if images.shape[1] == 1 else images
        return net(to_uint8(rgb))[0]

    return FeatureSpace(embed, TF_INCEPTION, True)


def tf_inception(state: dict[str, torch.Tensor]) -> nn.Module:
    """torch-fidelity's FeatureExtractorInceptionV3 (pool features) holding `state`. It reads weights with
    torch.load(weights_only=False), which would run a file's pickled code, so it gets a buffer serialised
    here from tensors already loaded with weights_only=True, never the file."""
    from torch_fidelity.feature_extractor_inceptionv3 import FeatureExtractorInceptionV3

    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return FeatureExtractorInceptionV3(TF_INCEPTION, ["2048"], feature_extractor_weights_path=buffer)


def classifier_space(classifier: nn.Module) -> FeatureSpace:
    """The penultimate features (`classifier.features`) of a trained SmallCNN, in eval mode."""
    classifier = classifier.eval().requires_grad_(False)
    return FeatureSpace(classifier.features, CLASSIFIER_NAME, False)


class Frechet:
    """FID of feature sets against one real set, whose statistics are kept across calls. An uncalibrated
    space's FID is divided by the square of the real features' spread (the root of their mean variance):
    the FID of features rescaled to unit spread, so a fallback's numbers do not hang on its network's scale."""

    def __init__(self, real: torch.Tensor, calibrated: bool):
        self.mean, self.factor = moments(real)
        spread_squared = float(self.factor.square().sum()) / real.shape[1]
        self.unit = 1.0 if calibrated or spread_squared == 0 else spread_squared

    def distance(self, fake: torch.Tensor) -> float:
        mean, factor = moments(fake)
        root_trace = torch.linalg.svdvals(self.factor @ factor.T).sum()  # Tr((S_real S_fake)^(1/2))
        value = (self.mean - mean).square().sum() + self.factor.square().sum() + factor.square().sum() - 2 * root_trace
        return float(value) / self.unit


def moments(features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The features' mean and a factor F of their sample covariance (F^T F = S), in float64: the centred
    features over sqrt(n - 1), or with more images than features the R of their QR (d x d), so no product
    of two factors is larger than min(n, d) on a side."""
    x = features.detach().double().cpu()
    mean = x.mean(dim=0)
    centred = (x - mean) / (len(x) - 1) ** 0.5
    return mean, (torch.linalg.qr(centred, mode="r").R if len(x) > x.shape[1] else centred)
