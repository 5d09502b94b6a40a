"""Node-local training: the one loop, which knows no strategy. A strategy hands it batches (here: E
epochs over a primary source, optionally replaying a buffer) and an objective (training/objectives.py).

With replay, each mini-batch concatenates its b primary images with round(b x ratio) replay images in one
forward pass (BatchNorm sees both; FedER's ratio is 1, half and half); the replay source is cycled without
replacement, so an epoch has as many steps as without replay. An epoch's last, partial batch is kept (ceil(n / b)
steps) or dropped (floor(n / b), full batches only: CWT's rule), `epoch_images`.
The optimiser is a fresh Adam or SGD (momentum, weight decay) each call. The learning rate is constant,
follows a cosine from lr to 0 over the run's whole budget, or is multiplied by a factor every so many epochs
of it (step); one call trains the span `LocalSettings.span` of the budget (fractions at its first and after
its last step), so every schedule stands where the run stands, whichever strategy or node trains.
"""

from __future__ import annotations

import dataclasses
import math

from collections.abc import Iterator, Sized

import torch
from torch import nn

from fedcli.core.precision import Scaled, autocast
from fedcli.data.dataset import augment_batch, to_float
from fedcli.data.tensor_source import TensorSource
from fedcli.training.objectives import Batch, Objective, Supervised


class Cycler:
    """Endless draws from a source, reshuffled after each full pass."""

    def __init__(self, source: TensorSource, generator: torch.Generator):
        self.source, self.generator = source, generator
        self.order = torch.empty(0, dtype=torch.long)

    def take(self, n: int) -> torch.Tensor:
        while len(self.order) < n:
            self.order = torch.cat([self.order, torch.randperm(len(self.source), generator=self.generator)])
        index, self.order = self.order[:n], self.order[n:]
        return index


@dataclasses.dataclass(frozen=True)
class LocalSettings:
    epochs: int
    lr: float
    batch: int
    augment: tuple[str, ...] = ()
    lr_schedule: str = "constant"
    span: tuple[float, float] = (0.0, 1.0)
    budget_epochs: int = 1  # the run's init-epochs + R x E, which the span is a fraction of
    lr_step_epochs: int = 35  # step schedule: lr x lr_step_factor every lr_step_epochs epochs of the budget
    lr_step_factor: float = 0.1
    optimizer: str = "adam"
    sgd_momentum: float = 0.9
    weight_decay: float = 0.0
    steps_per_round: int | None = None  # each epoch this many batches, whatever the source's size (its option's name)
    partial_batch: str | None = None  # --partial-batch keep|drop for every strategy; None: each strategy's own rule
    precision: str = "fp32"  # --precision: the forward and loss under autocast (core/precision.py)
    compile: bool = False  # --compile: the model's forward compiled for this call

    def lr_at(self, step: int, steps: int) -> float:
        """The learning rate of optimiser step `step` of this call's `steps`."""
        if self.lr_schedule == "constant":
            return self.lr
        start, end = self.span
        done = start + (end - start) * step / steps  # of the budget, before this step
        if self.lr_schedule == "step":
            return self.lr * self.lr_step_factor ** math.floor(done * self.budget_epochs / self.lr_step_epochs + 1e-9)
        return self.lr * 0.5 * (1 + math.cos(math.pi * done))

    def new_optimizer(self, parameters) -> torch.optim.Optimizer:
        """A fresh optimiser for one call (moments never travel); its rate is set step by step."""
        if self.optimizer == "sgd":
            return torch.optim.SGD(parameters, lr=self.lr, momentum=self.sgd_momentum, weight_decay=self.weight_decay)
        return torch.optim.Adam(parameters, lr=self.lr, weight_decay=self.weight_decay)

    def lr_sum(self, steps: int) -> float:
        """The sum of the learning rates of a call's `steps` optimiser steps (Scaffold's option II)."""
        return sum(self.lr_at(step, steps) for step in range(steps))


def epoch_images(n: int, batch: int, rule: str) -> int:
    """The primary images an epoch over n of them uses: all (`keep`: ceil(n / b) batches), or the full batches'
    (`drop`: floor(n / b) of them), all n when n < b so that a small node still trains."""
    return n if rule == "keep" or n < batch else n // batch * batch


def primary_per_epoch(n: int, settings: "LocalSettings", partial: str = "keep", epoch_size: int | None = None) -> int:
    """The primary images of one epoch over a source of n: `epoch_size` if given, else what the partial-batch rule
    (--partial-batch, else the strategy's `partial`) keeps; --steps-per-round's full batches override both."""
    if settings.steps_per_round and n:  # an empty source stays empty
        return settings.steps_per_round * settings.batch
    return epoch_images(n, settings.batch, settings.partial_batch or partial) if epoch_size is None else epoch_size


def batch_bounds(n: int, batch: int) -> list[tuple[int, int]]:
    """(start, end) of each mini-batch of an epoch: ceil(n / batch) of them, except that a last batch of
    a single image joins the one before (BatchNorm cannot normalise one image in training mode)."""
    bounds = [(start, min(start + batch, n)) for start in range(0, n, batch)]
    if len(bounds) > 1 and bounds[-1][1] - bounds[-1][0] == 1:
        bounds[-2:] = [(bounds[-2][0], n)]
    return bounds


def train_local(model: nn.Module, batches: Sized, settings: LocalSettings, device: str = "cpu",
                objective: Objective | None = None, on_batch=None) -> int:
    """Train in place on every batch of `batches` (a sized iterable of objectives.Batch, or of what the
    objective reads) with a fresh optimiser; return the number of optimiser steps.
    `objective`: the loss and its after-step hooks (default: supervised, training/objectives.py). `on_batch(images,
    labels, n_primary)` sees every batch (used by tests and the benchmark)."""
    model.train()
    model.to(memory_format=torch.channels_last)  # oneDNN's fast layout: ~20% less per CPU step (bench)
    if settings.compile:  # on the instance, so its state dict keeps its names
        model.forward = torch.compile(model.forward)
    try:
        return _train(model, batches, settings, device, objective or Supervised(), on_batch)
    finally:
        model.to(memory_format=torch.contiguous_format)  # what every reader of the weights expects
        if settings.compile:
            del model.forward


def _train(model: nn.Module, batches: Sized, settings: LocalSettings, device: str, objective: Objective,
           on_batch) -> int:
    optimizer = settings.new_optimizer(model.parameters())
    update = Scaled(optimizer, settings.precision, device)
    objective = objective.to(device)
    steps, total = 0, len(batches)
    for batch in batches:
        for group in optimizer.param_groups:
            group["lr"] = settings.lr_at(steps, total)
        if on_batch is not None:
            on_batch(batch.x, batch.labels, batch.n_primary)
        batch = batch.to(device)
        with autocast(settings.precision, device):
            loss = objective.loss(model, batch).float()
        optimizer.zero_grad(set_to_none=True)
        update.step(loss)
        objective.after_step(model, optimizer.param_groups[0]["lr"])
        steps += 1
    return steps


class Batches:
    """The batches of `settings.epochs` epochs, composed as local training composes them: shuffled primary
    batches, each joined by round(ratio x its size) replay images (`replay_ratio`), then augmented.
    `epoch_size`: primary images per epoch (default: what `partial` keeps of them, unless --partial-batch sets the
    rule for every strategy), drawn without replacement across epochs, so two sources of different sizes can be
    given the same number of steps; `settings.steps_per_round` overrides it with that many full batches. Also what
    the BatchNorm diagnostic re-estimates statistics on (training/batchnorm_check.py)."""

    def __init__(self, primary: TensorSource, replay: TensorSource | None, settings: LocalSettings,
                 generator: torch.Generator, epoch_size: int | None = None, partial: str = "keep",
                 replay_ratio: float = 1.0):
        self.primary, self.replay, self.settings, self.generator = primary, replay, settings, generator
        self.replay_ratio = replay_ratio
        self.epoch_size = primary_per_epoch(len(primary), settings, partial, epoch_size)

    def __len__(self) -> int:
        return self.settings.epochs * len(batch_bounds(self.epoch_size, self.settings.batch))

    def __iter__(self) -> Iterator[Batch]:
        primary, replay, settings, generator = self.primary, self.replay, self.settings, self.generator
        replayer = Cycler(replay, generator) if replay is not None and len(replay) else None
        primary_draws = Cycler(primary, generator)
        bounds = batch_bounds(self.epoch_size, settings.batch)
        for _ in range(settings.epochs):
            epoch = primary_draws.take(self.epoch_size)
            for start, end in bounds:
                index = self.drawn = epoch[start:end]  # the primary images' positions, for an audit's record
                images, labels = primary.images[index], primary.labels[index]
                n_primary = len(index)
                if replayer is not None:
                    r = replayer.take(round(n_primary * self.replay_ratio))  # the same share in a short last batch
                    images = torch.cat([images, replay.images[r]])
                    labels = torch.cat([labels, replay.labels[r]])
                yield Batch(self.prepare(images), labels, n_primary)

    def prepare(self, images: torch.Tensor) -> torch.Tensor:
        """The network's input from stored images: scaled to [-1, 1], augmented."""
        x = to_float(images)
        return augment_batch(x, self.settings.augment, self.generator) if self.settings.augment else x


class LatentBatches(Batches):
    """Batches of stored latents (what an encoder computed once): fed as they are, neither rescaled nor
    augmented (an image's flip is not a latent's)."""

    def prepare(self, images: torch.Tensor) -> torch.Tensor:
        return images
