"""Classifier factory: a user's own (models/user_models.py), a small CNN with BatchNorm for quick runs, and
torchvision's ResNet-18 (the FedER study's), ResNet-34 (the generative-replay study's), ResNet-50, DenseNet-121 and EfficientNet-B0 (FedPerl's; its
dropout and stochastic depth draw from the global generator, which local training seeds from a keyed stream for
each call: training/settings.py).

Grayscale input is handled by giving the first convolution one input channel (with ImageNet
weights, the RGB filters are summed, which is what they compute on a gray image repeated to RGB).
ImageNet weights are optional and taken only from the torch hub cache or a given file; nothing is
downloaded. Initialisation draws from a keyed seed, not from global state.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from fedcli.core.errors import UserError
from fedcli.core.weights import BACKBONES, hub_checkpoint, load_state
from fedcli.experiment.config import MODELS
from fedcli.models import user_models

HUB_FILES = {name: BACKBONES[name].filename for name in MODELS[1:]}


class SmallCNN(nn.Module):
    """Three conv-BN-ReLU stages and a linear head: quick on a CPU, and has BatchNorm so FedBN
    differs from FedAvg."""

    def __init__(self, in_channels: int, num_classes: int, width: int = 32):
        super().__init__()

        def stage(cin: int, cout: int, pool: bool) -> list[nn.Module]:
            layers = [nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True)]
            return layers + [nn.MaxPool2d(2)] if pool else layers

        self.features = nn.Sequential(*stage(in_channels, width, True), *stage(width, 2 * width, True),
                                      *stage(2 * width, 4 * width, False), nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.head = nn.Linear(4 * width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


def imagenet_state(name: str, weights: Path | None) -> dict:
    path = Path(weights) if weights else hub_checkpoint(HUB_FILES[name])
    if path is None:
        raise UserError(f"no ImageNet weights for {name}: run fedcli weights fetch {name} (it puts "
                        f"{HUB_FILES[name]} in the torch hub cache), pass --model-weights, or drop --pretrained")
    return load_state(path, f"ImageNet weights for {name}")


def torchvision_model(name: str, in_channels: int, num_classes: int, pretrained: bool,
                      weights: Path | None) -> nn.Module:
    import torchvision.models as tvm

    model = getattr(tvm, name)(weights=None)
    if pretrained:
        model.load_state_dict(imagenet_state(name, weights))
    first_name = {"resnet": "conv1", "densenet": "features.conv0", "efficientnet": "features.0.0"}[
        name.rstrip("0123456789_b")]
    first = model.get_submodule(first_name)
    if in_channels != 3:
        conv = nn.Conv2d(in_channels, first.out_channels, first.kernel_size, first.stride, first.padding, bias=False)
        if pretrained:  # gray = the RGB filters summed; without ImageNet weights the new conv keeps its own init
            with torch.no_grad():
                conv.weight.copy_(first.weight.sum(dim=1, keepdim=True).repeat(1, in_channels, 1, 1) / in_channels)
        parent = model if "." not in first_name else model.get_submodule(first_name.rsplit(".", 1)[0])
        setattr(parent, first_name.rsplit(".", 1)[-1], conv)
    if name.startswith("resnet"):
        model.fc = nn.Linear(model.fc.in_features, num_classes)
    elif name.startswith("efficientnet"):  # keeps its dropout before the last layer
        model.classifier[-1] = nn.Linear(model.classifier[-1].in_features, num_classes)
    else:
        model.classifier = nn.Linear(model.classifier.in_features, num_classes)
    return model


def build_classifier(name: str, in_channels: int, num_classes: int, init_seed: int, pretrained: bool = False,
                     weights: Path | None = None) -> nn.Module:
    user = user_models.is_user_model(name)
    if name not in MODELS and not user:
        raise UserError(f"unknown model {name!r}; choose one of {', '.join(MODELS)}, or module:factory")
    if pretrained and (user or name == "cnn"):
        raise UserError(f"--pretrained needs a torchvision model ({', '.join(MODELS[1:])}); {name} loads no "
                        "ImageNet weights")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(init_seed)
        if user:
            return user_models.build(name, in_channels, num_classes)
        if name == "cnn":
            return SmallCNN(in_channels, num_classes)
        return torchvision_model(name, in_channels, num_classes, pretrained, weights)


def batchnorm_keys(model: nn.Module) -> set[str]:
    """State-dict keys of every BatchNorm layer (weights, biases, running statistics), found by module
    type, so BN layers inside ResNet downsample branches count too."""
    keys = set()
    for module_name, module in model.named_modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            prefix = f"{module_name}." if module_name else ""
            keys.update(prefix + k for k in module.state_dict())
    return keys
