"""A kind of generator is one object implementing fedcli/generators.py's protocols: a tiny class-mean decoder,
registered from here, goes through train-gan, federate and the audit with no change to fedcli."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch
from torch import nn

from fedcli.artifacts import parse_tensors
from fedcli.data.dataset import NodeDataset, to_float
from fedcli.gan.kinds import KINDS, register
from fedcli.gan.perceptual import Perceptual
from fedcli.generators import CONTROL, RELEASED, STANDARD, Trained
from fedcli.layout import BUFFER, GENERATOR, GENERATOR_CONTROL, GENERATOR_PHASE1
from fedcli.replay.buffer import DECODED, to_uint8


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
    options = frozenset({"lpips_net", "lpips_weights"})

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


@pytest.fixture(scope="module")
def class_mean_kind():
    return KINDS.get("class-mean") or register(ClassMeanKind())


def test_a_class_mean_decoder_goes_through_train_gan_federate_and_the_audit(cli, tmp_path, class_mean_kind):
    exp = tmp_path / "exp"
    cli.ok("partition", "--nodes", "2", "--image-size", "16", "--exp", exp)
    assert "--z-dim" in cli.user_error("train-gan", "--exp", exp, "--generator", "class-mean", "--z-dim", "8")
    assert "stylegan2" in cli.user_error("train-gan", "--exp", exp, "--generator", "no-such-kind")
    cli.ok("train-gan", "--exp", exp, "--generator", "class-mean", "--fidelity-seeds", "1", "--fidelity-epochs", "1",
           "--buffer-size", "20")
    record = json.loads((exp / "gan" / "node0" / "config.json").read_text())
    assert record["config"]["generator"] == "class-mean" and record["buffer"]["decoded"]
    assert record["buffer"]["size"] == record["train_images"]  # decoded codes: one per real image, not --buffer-size
    assert set(record["fidelity"]) >= {"ratio", "phase1", "control"}
    assert parse_tensors((exp / "gan" / "node0" / BUFFER).read_bytes())[1]["decoded"] == DECODED
    assert "decoded" in cli.user_error("train-gan", "--exp", exp, "--sample-only", "--buffer-size", "10")

    cli.ok("federate", "--exp", exp, "--strategy", "feder", "--rounds", "1", "--epochs", "1", "--bootstrap", "20")
    assert (exp / "federate" / "feder" / "metrics.csv").is_file()

    cli.ok("audit-privacy", "--exp", exp, "--node", "node0", "--max-images", "10", "--steps", "3", "--optimize-noise")
    summary = json.loads((exp / "audit" / "node0" / "summary.json").read_text())
    assert set(summary["generators"]) == {"privacy", "control"} and summary["phase2_kept_iteration"] is None
    assert summary["verdict"]["result"] in ("pass", "fail", "inconclusive")
    # one generator in all three roles: the privacy effect against the control is exactly none
    assert summary["privacy_effect"]["median_ratio"] == 1.0


@pytest.mark.parametrize("options,titles", [
    ({}, ["standard GAN (phase 1)", "privacy-preserving GAN (phase 2, buffer)", "control (phase 2 at alpha 0)"]),
    ({"dp_epsilon": 3.0}, ["DP GAN, epsilon 3 (buffer)"]),  # its three roles hold one generator: one panel
    ({"generator": "vqvae2"}, ["released buffer: decoded codes of its real images"]),  # no prior by default
    ({"generator": "vqvae2", "prior_iterations": 50}, ["released buffer: prior samples",
                                                       "decoded codes of its real images"]),
    ({"generator": "vqvae2", "prior_iterations": 50, "dp_epsilon": 10.0},
     ["released buffer: DP prior samples, epsilon 10"]),
])
def test_samples_png_titles_each_panel_by_what_that_configuration_releases(tmp_path, options, titles):
    from fedcli.config import GanConfig
    cfg = GanConfig(exp=tmp_path, **options)
    assert list(KINDS[cfg.generator].titles(cfg).values()) == titles
