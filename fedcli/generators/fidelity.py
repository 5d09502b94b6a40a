"""How well a synthetic buffer stands in for the real images, with no pretrained network.

The score replays what federate will do with the buffer: the recipe's classifier (model, lr, batch,
number of steps) is trained on the buffer only and tested on the node's real *test* images
(synthetic accuracy, "GAN-train" of Shmelkov et al. 2018), and the same classifier is trained on
the node's real training images and tested on the same images (real accuracy, the standalone
strategy's number). ratio = synthetic / real. The real classifier's accuracy on the buffer itself
(class fidelity, "GAN-test") tells whether each synthetic image looks like its label. Every number
is the mean over `seeds` classifiers; classifier k starts from the same weights and the same number
of steps on either side, so the two sides differ only in their data.

A score tested on images the buffer holds would be meaningless, so a buffer that contains any of
the test images (other than ones that also occur among the training images) is refused.

A released buffer is flagged (`shortfalls`) when its classifier does no better than chance (always
answering the test set's most frequent class: what labels alone teach, so replaying the buffer can
only mislead), or when it scores below its control's buffer by more than the score's own 95%
interval: both accuracies are counts over the same n test images, so their difference's half-width
is 1.96 sqrt((p(1-p) + q(1-q)) / n) (taken as independent; their correlation would narrow it, so
the flag errs towards silence).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import torch

from fedcli.core.errors import UserError
from fedcli.core.rng import stream_seed, torch_stream
from fedcli.data.tensor_source import TensorSource
from fedcli.generators.buffer import sample_buffer
from fedcli.generators.protocol import Sampler
from fedcli.metrics.scores import accuracy, correct
from fedcli.models.classifier import build_classifier
from fedcli.training.local import Batches, LocalSettings, batch_bounds, train_local


@dataclasses.dataclass(frozen=True)
class Budget:
    """The classifier and its training budget: federate's, so the score predicts replay."""

    model: str = "cnn"
    epochs: int = 11  # over the node's real training images; the buffer gets the same number of steps
    lr: float = 1e-3
    batch: int = 32
    seeds: int = 3
    augment: tuple[str, ...] = ()


def config_budget(cfg, manifest) -> Budget:
    """A train-gan config's fidelity budget (`--fidelity-*`), with the partition's augmentations."""
    return Budget(model=cfg.fidelity_model, epochs=cfg.fidelity_epochs, lr=cfg.fidelity_lr, batch=cfg.fidelity_batch,
                  seeds=cfg.fidelity_seeds, augment=tuple(manifest.data.get("augment", ())))


def within(budget: Budget, allowance: int, train_images: int, buffers: int) -> Budget:
    """The most of `budget` whose classifiers (per seed, one on the real images and one per buffer, each of
    `epochs` passes over the node's `train_images`) take at most `allowance` steps in all, and at least one
    seed of one epoch. Seeds go first, down to one: fewer of them widen the mean's spread but leave what each
    classifier measures; then epochs, which train a weaker classifier on both sides."""
    per_epoch = (1 + buffers) * len(batch_bounds(train_images, budget.batch))
    seeds = min(budget.seeds, max(1, allowance // (per_epoch * budget.epochs)))
    epochs = min(budget.epochs, max(1, allowance // (per_epoch * seeds)))
    return dataclasses.replace(budget, seeds=seeds, epochs=epochs)


def image_keys(images: torch.Tensor) -> list[bytes]:
    return [image.numpy().tobytes() for image in images.cpu()]


def check_not_tested_on(buffers: dict[str, TensorSource], train: TensorSource, test: TensorSource, node: str) -> None:
    """Refuse a buffer holding test images: its classifier would be tested on what it trained on."""
    leaked = set(image_keys(test.images)) - set(image_keys(train.images))
    for name, buffer in buffers.items():
        held = sum(key in leaked for key in image_keys(buffer.images))
        if held:
            raise UserError(f"node {node}'s {name} buffer holds {held} of the node's test images, so its fidelity "
                            "would be measured on images it was trained on; the generator must be trained on the "
                            "node's training images only")


def train_classifier(source: TensorSource, budget: Budget, epoch_size: int, in_channels: int, num_classes: int,
                     key: tuple, device: str = "cpu") -> tuple[torch.nn.Module, int]:
    """budget.model trained on `source` for budget.epochs epochs of `epoch_size` images; initialised and
    drawn from streams keyed by `key` (seed, node, purpose, ...), so both sides of a comparison can share
    them. Returns the model and its number of steps."""
    seed, node, purpose, *rest = key
    model = build_classifier(budget.model, in_channels, num_classes, stream_seed(seed, node, f"{purpose}-init", *rest))
    model = model.to(device)
    settings = LocalSettings(epochs=budget.epochs, lr=budget.lr, batch=budget.batch, augment=budget.augment)
    batches = Batches(source, None, settings, torch_stream(seed, node, purpose, *rest), epoch_size)
    steps = train_local(model, batches, settings, device)
    return model, steps


def score(buffers: dict[str, TensorSource], train: TensorSource, test: TensorSource, budget: Budget, *,
          in_channels: int, num_classes: int, seed: int, node: str, device: str = "cpu") -> dict[str, dict]:
    """Per buffer name: synthetic_accuracy, real_accuracy, ratio and class_fidelity (means over seeds)."""
    check_not_tested_on(buffers, train, test, node)

    def trained(source: TensorSource, k: int) -> tuple[torch.nn.Module, int]:
        return train_classifier(source, budget, len(train), in_channels, num_classes, (seed, node, "fidelity", k),
                                device)

    real, synthetic, class_fidelity = [], {name: [] for name in buffers}, {name: [] for name in buffers}
    steps = {}
    for k in range(budget.seeds):
        model, _ = trained(train, k)
        real.append(accuracy(model, test, device))
        for name, buffer in buffers.items():
            class_fidelity[name].append(accuracy(model, buffer, device))
            synthetic_model, steps[name] = trained(buffer, k)
            synthetic[name].append(accuracy(synthetic_model, test, device))
    real_accuracy = float(np.mean(real))
    out = {}
    for name in buffers:
        synthetic_accuracy = float(np.mean(synthetic[name]))
        out[name] = {"synthetic_accuracy": synthetic_accuracy, "real_accuracy": real_accuracy,
                     "ratio": synthetic_accuracy / real_accuracy if real_accuracy > 0 else float("nan"),
                     "class_fidelity": float(np.mean(class_fidelity[name])), "steps": steps[name]}
    return out


@dataclasses.dataclass(frozen=True)
class SelectionJudge:
    """`--select fidelity`'s reading of a phase-1 snapshot (generators/stylegan2/selection.py): the buffer train-gan
    would
    release from it (the same draws) trains one classifier of the budget, whose accuracy on the GAN's own
    training images is read per class and weighted by the node's test-set class mix (its labels, not its
    images): an estimate of the synthetic accuracy the fidelity ratio reports, which the training images'
    own mix would bias (partition balances test sets; a node's training images need not be). The test
    images stay unread, so the ratio reported for the kept snapshot is not chosen on them; the classifier
    has its own stream (`selection`), the same for every snapshot, so two readings differ by their buffers
    only, and the reported score's classifiers are not the ones selected on. A generator that copies its
    training images reads high: `--select last` never reads them."""

    train: TensorSource
    test_mix: dict[int, float]  # class -> its share of the node's test images
    classes: list[int]
    size: int
    truncation: float
    budget: Budget
    in_channels: int
    num_classes: int
    seed: int
    node: str
    device: str = "cpu"

    def buffer(self, generator: Sampler) -> TensorSource:
        """The buffer train-gan would release from `generator`."""
        return TensorSource(*sample_buffer(generator, self.classes, self.size, self.seed, self.node, self.device,
                                           self.truncation))

    def recalls(self, buffer: TensorSource) -> dict[int, float]:
        """Per class of the training images: the share a classifier trained on `buffer` gets right."""
        model, _ = train_classifier(buffer, self.budget, len(self.train), self.in_channels, self.num_classes,
                                    (self.seed, self.node, "selection"), self.device)
        labels = self.train.labels.numpy()
        right = correct(model, self.train, self.device)
        return {int(c): float(right[labels == c].mean()) for c in np.unique(labels)}

    def reading(self, recalls: dict[int, float]) -> float:
        return sum(share * recalls.get(c, 0.0) for c, share in self.test_mix.items())

    def __call__(self, generator: Sampler) -> float:
        return self.reading(self.recalls(self.buffer(generator)))


def selection_judge(cfg, manifest, node: str, seed: int, train: TensorSource, device: str) -> SelectionJudge:
    """A train-gan config's judge for a GAN trained on `train` (the node's images, or a side GAN's subset)."""
    test = [r["label"] for r in manifest.records(node, "test")]
    mix = {c: test.count(c) / len(test) for c in sorted(set(test))}
    return SelectionJudge(train, mix, sorted(set(train.labels.tolist())), cfg.buffer_size, cfg.truncation,
                          config_budget(cfg, manifest), manifest["channels"], manifest.num_classes, seed, node, device)


Z_95 = 1.959964
BELOW_CHANCE, BELOW_CONTROL = "below chance", "below control"


def chance_accuracy(labels: torch.Tensor) -> float:
    """The accuracy of always answering the most frequent of `labels`."""
    return float(torch.bincount(labels).max()) / len(labels) if len(labels) else math.nan


def difference_margin(p: float, q: float, n: int) -> float:
    """Half-width of the 95% interval of the difference between two accuracies on the same n images."""
    return Z_95 * math.sqrt((p * (1 - p) + q * (1 - q)) / n)


def shortfalls(released: dict, control: dict | None, chance: float, test_images: int) -> dict:
    """The released buffer's flags (BELOW_CHANCE, BELOW_CONTROL) and what they were measured against, in
    ratio units: `floor` (chance over the real accuracy) and `control_margin`."""
    real = released["real_accuracy"]
    flags = [BELOW_CHANCE] if released["synthetic_accuracy"] <= chance else []
    out = {"chance_accuracy": chance, "floor": chance / real if real > 0 else math.nan}
    if control is not None and test_images:
        margin = difference_margin(released["synthetic_accuracy"], control["synthetic_accuracy"], test_images)
        out["control_margin"] = margin / real if real > 0 else math.nan
        if released["synthetic_accuracy"] < control["synthetic_accuracy"] - margin:
            flags.append(BELOW_CONTROL)
    return out | {"flags": flags}
