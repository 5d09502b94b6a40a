"""The class-mean kind: KIND, as the registry looks for it in a generator plugin's package."""

from __future__ import annotations

import pandas as pd
import torch
from torch import nn

from fedcli.data.dataset import NodeDataset, to_float
from fedcli.experiment.paths import GENERATOR, GENERATOR_CONTROL, GENERATOR_PHASE1
from fedcli.generators.buffer import to_uint8
from fedcli.generators.perceptual import Perceptual
from fedcli.generators.protocol import CONTROL, RELEASED, STANDARD, Trained
from fedcli_test_plugins.class_mean.options import ClassMeanOptions


class ClassMeans(nn.Module):
    """Each class's mean training image. Code of an image: its label; a sample: its class's mean plus keyed
    noise; a latent: logits over the classes, rendered as the softmax mixture of their means."""

    def __init__(self, num_classes: int, shape: list[int]):
        super().__init__()
        self.means = nn.Parameter(torch.zeros(num_classes, *shape), requires_grad=False)

    def encode(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return labels

    def decode(self, codes: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return self.means[codes]

    def sample(self, labels: torch.Tensor, stream: torch.Generator, truncation: float = 1.0) -> torch.Tensor:
        noise = torch.randn(len(labels), *self.means.shape[1:], generator=stream).to(labels.device)
        return (self.decode(labels, labels) + 0.1 * noise).clamp(-1, 1)

    def start(self, labels: torch.Tensor, stream: torch.Generator) -> tuple[torch.Tensor, float]:
        return 4.0 * nn.functional.one_hot(labels, len(self.means)).float(), 1.0

    def render(self, latents: torch.Tensor, noise=None) -> torch.Tensor:
        return (latents.softmax(dim=1) @ self.means.flatten(1)).view(-1, *self.means.shape[1:])

    def noise_shapes(self) -> list[tuple[int, ...]]:
        return []


class ClassMeanKind:
    name = "class-mean"
    options = ClassMeanOptions

    def titles(self, cfg):
        return {STANDARD: "class means", RELEASED: "class means (buffer: decoded)", CONTROL: "class means"}

    def plans(self, cfg, manifest, nodes, seed):
        return {}

    def trainer(self, cfg, manifest, nodes, seed, device):
        return ClassMeanTraining(manifest, Perceptual(cfg.lpips_net, cfg.lpips_weights), device)

    def build(self, record: dict) -> ClassMeans:
        return ClassMeans(record["num_classes"], record["shape"])

    def image_size(self, record: dict) -> int:
        return record["shape"][-1]

    def latent_sizes(self, record: dict) -> tuple[int, int]:
        return record["num_classes"], record["num_classes"]


class ClassMeanTraining:
    def __init__(self, manifest, perceptual: Perceptual, device: str):
        self.manifest, self.perceptual, self.device = manifest, perceptual, device

    def train(self, node: str, data: NodeDataset) -> Trained:
        record = {"num_classes": self.manifest.num_classes, "shape": list(data.images.shape[1:]),
                  "train_images": len(data), "lpips": self.perceptual.record()}
        model = ClassMeanKind().build(record)
        images = to_float(data.images)
        for c in data.labels.unique().tolist():
            model.means.data[c] = images[data.labels == c].mean(dim=0)
        model = model.to(self.device)
        decoded = to_uint8(model.decode(model.encode(images, data.labels), data.labels)).cpu(), data.labels.clone()
        state = {k: v.cpu() for k, v in model.state_dict().items()}
        files = {name: (state, {"node": node}) for name in (GENERATOR, GENERATOR_PHASE1, GENERATOR_CONTROL)}
        return Trained({STANDARD: model, RELEASED: model, CONTROL: model}, files,
                       pd.DataFrame({"class": data.labels.unique().tolist()}), record, decoded)


KIND = ClassMeanKind()
