"""Node-local training: E epochs over a primary source, optionally replaying a buffer.

With replay, each mini-batch concatenates b primary and b replay images in one forward pass
(BatchNorm sees both) and the loss is lambda * CE(primary) + (1 - lambda) * CE(replay); the
replay source is cycled without replacement, so an epoch has as many steps as without replay.
FedProx adds (mu / 2) * ||w - w_global||^2. A fresh Adam each call: optimiser moments never travel.
The learning rate is constant, or follows a cosine from lr to 0 over the run's whole budget, of which
one call trains the span `LocalSettings.span` (fractions of the budget at its first and after its last step).
"""

from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn.functional as F
from torch import nn

from fedcli.data.dataset import augment_batch, to_float
from fedcli.data.tensor_source import TensorSource


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
    lam: float = 0.5
    mu: float = 0.0
    augment: tuple[str, ...] = ()
    schedule: str = "constant"
    span: tuple[float, float] = (0.0, 1.0)

    def lr_at(self, step: int, steps: int) -> float:
        """The learning rate of optimiser step `step` of this call's `steps`."""
        if self.schedule == "constant":
            return self.lr
        start, end = self.span
        return self.lr * 0.5 * (1 + math.cos(math.pi * (start + (end - start) * step / steps)))

    def lr_sum(self, steps: int) -> float:
        """The sum of the learning rates of a call's `steps` optimiser steps (Scaffold's option II)."""
        return sum(self.lr_at(step, steps) for step in range(steps))


def batch_bounds(n: int, batch: int) -> list[tuple[int, int]]:
    """(start, end) of each mini-batch of an epoch: ceil(n / batch) of them, except that a last batch of
    a single image joins the one before (BatchNorm cannot normalise one image in training mode)."""
    bounds = [(start, min(start + batch, n)) for start in range(0, n, batch)]
    if len(bounds) > 1 and bounds[-1][1] - bounds[-1][0] == 1:
        bounds[-2:] = [(bounds[-2][0], n)]
    return bounds


def replay_loss(logits: torch.Tensor, labels: torch.Tensor, n_primary: int, lam: float) -> torch.Tensor:
    """lambda * CE(primary part) + (1 - lambda) * CE(replay part) of one concatenated batch."""
    primary = F.cross_entropy(logits[:n_primary], labels[:n_primary])
    if n_primary == len(labels):
        return primary
    return lam * primary + (1 - lam) * F.cross_entropy(logits[n_primary:], labels[n_primary:])


def proximal_term(model: nn.Module, anchor: dict[str, torch.Tensor], mu: float) -> torch.Tensor:
    return (mu / 2) * sum((p - anchor[name]).square().sum() for name, p in model.named_parameters())


def train_local(model: nn.Module, primary: TensorSource, replay: TensorSource | None, settings: LocalSettings,
                generator: torch.Generator, device: str = "cpu", anchor: dict[str, torch.Tensor] | None = None,
                on_batch=None, epoch_size: int | None = None, correction: dict[str, torch.Tensor] | None = None) -> int:
    """Train in place; return the number of optimiser steps. `on_batch(images, labels, n_primary)` sees
    every batch (used by tests and the benchmark). `epoch_size`: primary images per epoch (default all
    of them), drawn without replacement across epochs, so two sources of different sizes can be given
    the same number of steps. `correction` (Scaffold's c - c_i, per parameter): after each optimiser step
    every parameter also moves by -lr times its correction."""
    model.train()
    model.to(memory_format=torch.channels_last)  # oneDNN's fast layout: ~20% less per CPU step (bench)
    try:
        return _train_epochs(model, primary, replay, settings, generator, device, anchor, on_batch, epoch_size,
                             correction)
    finally:
        model.to(memory_format=torch.contiguous_format)  # what every reader of the weights expects


def _train_epochs(model, primary, replay, settings, generator, device, anchor, on_batch, epoch_size,
                  correction) -> int:
    optimizer = torch.optim.Adam(model.parameters(), lr=settings.lr)
    anchor = {k: v.to(device) for k, v in anchor.items()} if anchor is not None and settings.mu > 0 else None
    correction = {k: v.to(device) for k, v in correction.items()} if correction is not None else None
    steps, total = 0, settings.epochs * len(batch_bounds(len(primary) if epoch_size is None else epoch_size,
                                                          settings.batch))
    for x, labels, n_primary in training_batches(primary, replay, settings, generator, epoch_size):
        for group in optimizer.param_groups:
            group["lr"] = settings.lr_at(steps, total)
        if on_batch is not None:
            on_batch(x, labels, n_primary)
        x, labels = x.to(device).contiguous(memory_format=torch.channels_last), labels.to(device)
        loss = replay_loss(model(x), labels, n_primary, settings.lam)
        if anchor is not None:
            loss = loss + proximal_term(model, anchor, settings.mu)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if correction is not None:
            with torch.no_grad():
                for name, parameter in model.named_parameters():
                    parameter.sub_(correction[name], alpha=optimizer.param_groups[0]["lr"])
        steps += 1
    return steps


def training_batches(primary: TensorSource, replay: TensorSource | None, settings: LocalSettings,
                     generator: torch.Generator, epoch_size: int | None = None):
    """The (float images, labels, number of primary images) batches of `settings.epochs` epochs, composed
    as local training composes them: shuffled primary batches, each joined by as many replay images, then
    augmented. Also what the BatchNorm diagnostic re-estimates statistics on (fl/batchnorm_check.py)."""
    replayer = Cycler(replay, generator) if replay is not None and len(replay) else None
    primary_draws = Cycler(primary, generator)
    epoch_size = len(primary) if epoch_size is None else epoch_size
    bounds = batch_bounds(epoch_size, settings.batch)
    for _ in range(settings.epochs):
        epoch = primary_draws.take(epoch_size)
        for start, end in bounds:
            index = epoch[start:end]
            images, labels = primary.images[index], primary.labels[index]
            n_primary = len(index)
            if replayer is not None:
                r = replayer.take(n_primary)  # half and half, also in a short last batch
                images = torch.cat([images, replay.images[r]])
                labels = torch.cat([labels, replay.labels[r]])
            x = to_float(images)
            if settings.augment:
                x = augment_batch(x, settings.augment, generator)
            yield x, labels, n_primary
