"""FixMatch (Sohn et al. 2020) as a local objective: the supervised loss of the labelled (and replayed) images
plus lambda_u times the consistency loss of the unlabelled ones.

For each unlabelled image u, q = softmax f(weak(u)) with no gradient; the loss is
    mean over all mu B unlabelled images of 1[max q >= tau] CE(argmax q, f(strong(u))),
the paper's mean over every unlabelled image (FedPerl's code averages over the confident ones only, which
weighs a batch with one confident image as much as one with all; fedcli follows the paper). Labelled, weak and
strong images go through the network in one forward pass, so BatchNorm normalises them together, as the
paper's reference implementation does by interleaving. The labelled images keep the augmentation every
strategy gives them (the source's flips), not FixMatch's weak shift, so that FixMatch differs from its lower
bound by the unlabelled term alone.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Iterator, Sized

import torch
import torch.nn.functional as F
from torch import nn

from fedcli.data.dataset import to_float
from fedcli.data.tensor_source import TensorSource
from fedcli.training.local import Cycler, LocalSettings
from fedcli.training.objectives import Batch, Objective, Supervised, Wrapped, replay_loss


@dataclasses.dataclass
class SemiBatch(Batch):
    """A batch with its unlabelled part: each unlabelled image's weak and strong view, in the same order."""

    weak: torch.Tensor = None
    strong: torch.Tensor = None

    def to(self, device: str) -> "SemiBatch":
        moved = super().to(device)
        return SemiBatch(moved.x, moved.labels, moved.n_primary,
                         *(v.to(device).contiguous(memory_format=torch.channels_last) for v in (self.weak, self.strong)))


@dataclasses.dataclass(frozen=True)
class FixMatchSettings:
    confidence: float = 0.95  # tau: the paper's; FedPerl's code 0.6
    lambda_u: float = 1.0  # the paper's; FedPerl's code 0.5
    lam: float = 0.5  # the supervised part's weight of primary against replayed images (objectives.Supervised)


class FixMatch(Objective):
    """The supervised loss of `batch.x` plus lambda_u times the masked consistency of the unlabelled images."""

    def __init__(self, settings: FixMatchSettings):
        self.settings = settings

    def loss(self, model: nn.Module, batch: SemiBatch) -> torch.Tensor:
        n, u = len(batch.x), len(batch.weak)
        logits = model(torch.cat([batch.x, batch.weak, batch.strong]))
        unlabelled = self.unlabelled(logits[n:n + u], logits[n + u:], batch) if u else None
        if n == 0:  # a node without labels (FedPerl's scenarios 2 and 4): the unlabelled term alone
            return unlabelled
        supervised = replay_loss(logits[:n], batch.labels, batch.n_primary, self.settings.lam)
        return supervised if unlabelled is None else supervised + unlabelled

    def unlabelled(self, weak_logits: torch.Tensor, strong_logits: torch.Tensor, batch: SemiBatch) -> torch.Tensor:
        """The unlabelled images' term: lambda_u times the masked cross-entropy of the strong views against the
        weak views' confident labels (a subclass labels them otherwise, or adds a term)."""
        confidence, pseudo = torch.softmax(weak_logits.detach(), dim=1).max(dim=1)
        return self.settings.lambda_u * masked_cross_entropy(strong_logits, pseudo, confidence >= self.settings.confidence)


def masked_cross_entropy(logits: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The mean over every image of 1[mask] CE: unmasked images count in the mean with a loss of 0 (FixMatch's)."""
    return (F.cross_entropy(logits, labels, reduction="none") * mask.to(logits.dtype)).mean()


class SemiBatches:
    """A strategy's batches, each joined by mu unlabelled images per labelled one, in their weak and strong views.
    The unlabelled images are cycled without replacement from their own keyed stream, so the labelled batches
    are the supervised run's, draw for draw. A node without labelled images (FedPerl's scenarios 2 and 4) takes
    batches of mu B unlabelled images alone, as many an epoch as `settings.steps_per_round` (the trainer's few-labels
    epoch, or --steps-per-round), else the upper bound's ceil(n_u / B)."""

    def __init__(self, labelled: Sized, unlabelled: TensorSource, mu: int, flips: tuple[str, ...],
                 generator: torch.Generator, settings: LocalSettings):
        self.labelled, self.unlabelled, self.mu, self.flips, self.generator = labelled, unlabelled, mu, flips, generator
        self.batch = settings.batch  # an unlabelled-only batch holds mu times as many images
        per_epoch = settings.steps_per_round or math.ceil(len(unlabelled) / settings.batch)
        self.unlabelled_only = settings.epochs * per_epoch if len(labelled) == 0 and len(unlabelled) else 0

    def __len__(self) -> int:
        return self.unlabelled_only or len(self.labelled)

    def __iter__(self) -> Iterator[SemiBatch]:
        from fedcli.data.fixmatch_augment import strong_view, weak_view  # torchvision: not on the CLI's start-up path

        draws = Cycler(self.unlabelled, self.generator) if len(self.unlabelled) else None
        nothing = Batch(to_float(self.unlabelled.images[:0]), self.unlabelled.labels[:0], 0)
        labelled = [nothing] * self.unlabelled_only if self.unlabelled_only else self.labelled
        for batch in labelled:
            index = draws.take(self.mu * (batch.n_primary or self.batch)) if draws else torch.empty(0, dtype=torch.long)
            raw = self.unlabelled.images[index]
            yield SemiBatch(batch.x, batch.labels, batch.n_primary, weak_view(raw, self.flips, self.generator),
                            strong_view(raw, self.flips, self.generator))


def with_fixmatch(objective: Objective, settings: FixMatchSettings) -> Objective:
    """`objective` with FixMatch in place of the supervised loss at its core: a strategy's own terms (FedProx's
    proximal term, Scaffold's correction) wrap FixMatch as they wrapped the supervised loss; its replay weight
    (lambda) is kept."""
    if isinstance(objective, Wrapped):
        wrapped = copy.copy(objective)
        wrapped.base = with_fixmatch(objective.base, settings)
        return wrapped
    if isinstance(objective, FixMatch):  # a strategy's own FixMatch (peers labelling the unlabelled images)
        return objective
    if isinstance(objective, Supervised):
        return FixMatch(dataclasses.replace(settings, lam=objective.lam))
    raise TypeError(f"FixMatch cannot replace the core of {type(objective).__name__}")


@dataclasses.dataclass(frozen=True)
class Semi:
    """--ssl fixmatch composed with any strategy's local training: its batches joined by the node's unlabelled
    images (mu per labelled one), its objective with FixMatch at the core."""

    fixmatch: FixMatchSettings
    mu: int

    def compose(self, batches: Sized, objective: Objective | None, unlabelled: TensorSource, flips: tuple[str, ...],
                generator: torch.Generator, settings: LocalSettings) -> tuple[SemiBatches, Objective]:
        return (SemiBatches(batches, unlabelled, self.mu, flips, generator, settings),
                with_fixmatch(objective or Supervised(), self.fixmatch))
