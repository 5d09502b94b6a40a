"""Where a classifier is cut in two, for the methods that send what its first layers compute (FedReplay's
latents, SplitNN's activations): the bottom (the encoder, the client's part) and the top (the head, the
server's part), both sharing the classifier's own modules, so training either trains the classifier and
top(bottom(x)) is the classifier's output.

The cuts, after:
- `stem`: the first convolution with its BatchNorm and ReLU, and the pooling that follows it: ResNet's
  conv1, bn1, relu and max-pool (the generative-replay study's journal version cuts there), DenseNet's
  conv0 to pool0, the small CNN's first conv-BN-ReLU-pool stage;
- `layer1` to `layer4` (ResNet), `block1` to `block4` (DenseNet: a dense block with the transition after it,
  the last with its final norm), `stage2` and `stage3` (the small CNN): after that stage; what is left is at
  least the pooling and the linear layer.
"""

from __future__ import annotations

from torch import nn

from fedcli.core.errors import UserError
from fedcli.models import user_models

STEM = "stem"
CUTS = {
    "cnn": (STEM, "stage2", "stage3"),
    **{name: (STEM, "layer1", "layer2", "layer3", "layer4") for name in ("resnet18", "resnet34", "resnet50")},
    "densenet121": (STEM, "block1", "block2", "block3", "block4"),
}
ALL_CUTS = tuple(dict.fromkeys(cut for cuts in CUTS.values() for cut in cuts))
# modules of each architecture (in forward order) that end at each cut
ENDS = {
    "cnn": {STEM: 4, "stage2": 8, "stage3": 11},  # indices into SmallCNN.features
    "resnet": {STEM: "maxpool", "layer1": "layer1", "layer2": "layer2", "layer3": "layer3", "layer4": "layer4"},
    "densenet121": {STEM: "pool0", "block1": "transition1", "block2": "transition2", "block3": "transition3",
                    "block4": "norm5"},
}


def check_cut(architecture: str, cut: str) -> None:
    if user_models.is_user_model(architecture):
        declared = tuple(user_models.cuts(architecture))
        if cut not in declared:
            offered = f"it declares {', '.join(declared)}" if declared else "its factory declares no `cuts`"
            raise UserError(f"--cut {cut} is not a cut of --model {architecture} ({offered}); declare it as "
                            f"factory.cuts = {{{cut!r}: split}} with split(model) -> (bottom, top) (docs/python.md)")
        return
    if architecture not in CUTS:
        raise UserError(f"{architecture} has no cut (splitnn and fedreplay cut {', '.join(CUTS)}); choose one of them "
                        "with --model")
    if cut not in CUTS[architecture]:
        raise UserError(f"--cut {cut} is not a cut of {architecture}; choose from {', '.join(CUTS[architecture])}")


def split(model: nn.Module, architecture: str, cut: str) -> tuple[nn.Sequential, nn.Sequential]:
    """(bottom, top) of `model` at `cut`, made of the model's own modules."""
    check_cut(architecture, cut)
    if user_models.is_user_model(architecture):
        return user_models.split(architecture, cut, model)
    if architecture == "cnn":
        end = ENDS["cnn"][cut]
        layers = list(model.features)
        return nn.Sequential(*layers[:end]), nn.Sequential(*layers[end:], model.head)
    if architecture.startswith("resnet"):
        names = ["conv1", "bn1", "relu", "maxpool", "layer1", "layer2", "layer3", "layer4"]
        end = names.index(ENDS["resnet"][cut]) + 1
        layers = [getattr(model, name) for name in names]
        return nn.Sequential(*layers[:end]), nn.Sequential(*layers[end:], model.avgpool, nn.Flatten(), model.fc)
    children = list(model.features.named_children())
    end = [name for name, _ in children].index(ENDS["densenet121"][cut]) + 1
    layers = [module for _, module in children]
    return (nn.Sequential(*layers[:end]),
            nn.Sequential(*layers[end:], nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), model.classifier))


def cut_shape(bottom: nn.Module, image_shape: tuple[int, int, int]) -> tuple[int, ...]:
    """The shape of what `bottom` computes from one image (C, H, W), without touching its statistics."""
    import torch

    was_training = bottom.training
    bottom.eval()
    try:
        with torch.no_grad():
            parameter = next(bottom.parameters())
            return tuple(bottom(torch.zeros((1, *image_shape), device=parameter.device)).shape[1:])
    finally:
        bottom.train(was_training)
