"""Pretrained weights: a file the user gives, else the published file in the torch hub cache.

Stages never download: `fedcli weights fetch` is the only code that does, and only when the user
runs it, from the URL torchvision (or, for FID's Inception, torch-fidelity) publishes, through
torch.hub's hash-checked download into the hub cache where the stages look. Files are read with
`weights_only=True`, so loading runs no pickled code.
"""

from __future__ import annotations

import dataclasses
import hashlib
import warnings
from pathlib import Path

import torch

from fedcli.core.errors import UserError


TORCH_FIDELITY = "torch-fidelity"  # a Backbone's `weights`: torch-fidelity's TF-ported Inception-v3


@dataclasses.dataclass(frozen=True)
class Backbone:
    """An ImageNet network fedcli can use: where its weights are published (torchvision's entry,
    `Enum.MEMBER` in torchvision.models, or TORCH_FIDELITY) and the hub cache's file name (the download
    URL's last part, whose `-<hex>.` names a prefix of the file's sha256)."""

    name: str
    use: str
    weights: str
    filename: str
    without: str  # what fedcli does when the file is absent


BACKBONES = {b.name: b for b in (
    Backbone("vgg", "LPIPS backbone, --lpips-net vgg (the study's)", "VGG16_Weights.IMAGENET1K_V1",
             "vgg16-397923af.pth", "vgg-random: a fixed random VGG16, uncalibrated LPIPS"),
    Backbone("alex", "LPIPS backbone, --lpips-net alex", "AlexNet_Weights.IMAGENET1K_V1",
             "alexnet-owt-7be5be79.pth", "alex-random: a fixed random AlexNet, uncalibrated LPIPS"),
    Backbone("inception", "FID features: torch-fidelity's TF-ported Inception-v3, as published FIDs",
             TORCH_FIDELITY, "weights-inception-2015-12-05-6726825d.pth",
             "cnn-node: a small CNN trained on each node's images, uncalibrated FID"),
    *(Backbone(name, f"classifier, --model {name} --pretrained", weights, filename,
               "--pretrained refused; random initialisation")
      for name, weights, filename in (("resnet18", "ResNet18_Weights.IMAGENET1K_V1", "resnet18-f37072fd.pth"),
                                      ("resnet34", "ResNet34_Weights.IMAGENET1K_V1", "resnet34-b627a593.pth"),
                                      ("resnet50", "ResNet50_Weights.IMAGENET1K_V2", "resnet50-11ad3fa6.pth"),
                                      ("densenet121", "DenseNet121_Weights.IMAGENET1K_V1",
                                       "densenet121-a639ec97.pth"),
                                      ("efficientnet_b0", "EfficientNet_B0_Weights.IMAGENET1K_V1",
                                       "efficientnet_b0_rwightman-7f5810bc.pth"))),
)}


def hub_dir() -> Path:
    return Path(torch.hub.get_dir()) / "checkpoints"


def hub_checkpoint(filename: str) -> Path | None:
    """torchvision's cached file `filename` (`$TORCH_HOME/hub/checkpoints/`), if it is there."""
    path = hub_dir() / filename
    return path if path.is_file() else None


def load_state(path: Path, what: str) -> dict:
    try:
        with warnings.catch_warnings():  # torch warns of a pickle protocol it then refuses: the refusal is the line
            warnings.simplefilter("ignore", UserWarning)
            return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises many types for a bad file
        raise UserError(f"{what} {path} is not a plain PyTorch state dict of tensors ({load_failure(exc)}); fedcli "
                        "never runs pickled code from a weights file, so give the published file (what fedcli "
                        "weights fetch downloads)") from exc


def load_failure(exc: Exception) -> str:
    """Why torch refused a file, without its advice to load it with weights_only=False: that advice is
    wrong for a file from elsewhere, which could run code."""
    text = str(exc)
    if "WeightsUnpickler error:" in text:
        detail = text.split("WeightsUnpickler error:", 1)[1].strip().splitlines()
        first = detail[0].split(". ")[0].strip() if detail else "unsupported content"
        return f"not loadable without running pickled code: {first[:160]}"
    return (text.strip().splitlines() or [type(exc).__name__])[0][:200]


def expected_prefix(filename: str) -> str:
    match = torch.hub.HASH_REGEX.search(filename)
    return match.group(1) if match else ""


def state_of(backbone: Backbone) -> str:
    """`present` (its sha256 starts with the prefix its name carries), `corrupt` or `absent`."""
    path = hub_checkpoint(backbone.filename)
    if path is None:
        return "absent"
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return "present" if digest.hexdigest().startswith(expected_prefix(backbone.filename)) else "corrupt"


def url(backbone: Backbone) -> str:
    """Where `backbone`'s file is published: torchvision's weights entry, or torch-fidelity's own constant."""
    if backbone.weights == TORCH_FIDELITY:
        from torch_fidelity.feature_extractor_inceptionv3 import URL_INCEPTION_V3

        return URL_INCEPTION_V3
    import torchvision.models

    enum, member = backbone.weights.split(".")
    return getattr(getattr(torchvision.models, enum), member).url


def fetch(backbone: Backbone) -> str:
    """Download `backbone` into the hub cache with torch.hub (hash-checked, then loaded without pickled
    code), as torchvision's weights API does; return what was done."""
    state = state_of(backbone)
    if state == "present":
        return "already present"
    if state == "corrupt":
        raise UserError(f"{hub_dir() / backbone.filename} is there but its sha256 does not match its name; delete it "
                        "and re-run fedcli weights fetch")
    source = url(backbone)
    target = hub_dir() / backbone.filename
    try:
        torch.hub.load_state_dict_from_url(source, progress=False, check_hash=True, file_name=backbone.filename,
                                           weights_only=True)
    except Exception as exc:  # network, hash and load failures all end the same way
        target.unlink(missing_ok=True)
        raise UserError(f"could not fetch {backbone.name} from {source} ({load_failure(exc)}); check the "
                        f"connection, or download that file by hand into {hub_dir()}") from exc
    return f"downloaded {target}"
