"""FixMatch's loss against a hand computation: the mask over all mu B unlabelled images, no gradient through
the pseudo label."""

from __future__ import annotations

import math

import torch
from torch import nn

from fedcli.training.fixmatch import FixMatch, FixMatchSettings, SemiBatch


class Table(nn.Module):
    """Logits looked up per image: image i (a one-hot row) gets row i of the table."""

    def __init__(self, logits: torch.Tensor):
        super().__init__()
        self.table = nn.Parameter(logits.clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.flatten(1) @ self.table


def ce(logits: list[float], label: int) -> float:
    return -logits[label] + math.log(sum(math.exp(v) for v in logits))


def softmax(logits: list[float]) -> list[float]:
    total = sum(math.exp(v) for v in logits)
    return [math.exp(v) / total for v in logits]


def test_the_fixmatch_loss_matches_a_hand_computation():
    rows = [[2.0, 0.0, 0.0],   # labelled, class 0
            [0.0, 1.0, 0.0],   # labelled, class 2
            [3.0, 0.0, 0.0],   # weak u1: confident class 0
            [0.2, 0.1, 0.0],   # weak u2: below the threshold
            [0.0, 0.0, 4.0],   # weak u3: confident class 2
            [0.5, 1.0, 0.0],   # strong u1
            [1.0, 1.0, 1.0],   # strong u2
            [0.0, 2.0, 1.0]]   # strong u3
    model = Table(torch.tensor(rows))
    eye = torch.eye(8).view(8, 1, 8, 1)
    batch = SemiBatch(eye[:2], torch.tensor([0, 2]), 2, eye[2:5], eye[5:])
    settings = FixMatchSettings(confidence=0.7, lambda_u=0.5)
    loss = FixMatch(settings).loss(model, batch)
    supervised = (ce(rows[0], 0) + ce(rows[1], 2)) / 2
    weak = [softmax(rows[i]) for i in (2, 3, 4)]
    assert max(weak[0]) >= 0.7 and max(weak[1]) < 0.7 and max(weak[2]) >= 0.7
    unlabelled = (ce(rows[5], 0) + 0 + ce(rows[7], 2)) / 3  # the mean over all three, the unconfident one at 0
    assert math.isclose(loss.item(), supervised + 0.5 * unlabelled, rel_tol=1e-6)
    loss.backward()
    # no gradient through the pseudo label: the weak rows get none, the unconfident strong row none
    grad = model.table.grad
    assert torch.count_nonzero(grad[2:5]) == 0 and torch.count_nonzero(grad[6]) == 0
    assert torch.count_nonzero(grad[5]) == 3 and torch.count_nonzero(grad[7]) == 3


def test_without_unlabelled_images_fixmatch_is_the_supervised_loss():
    model = Table(torch.randn(4, 3, generator=torch.Generator().manual_seed(0)))
    eye = torch.eye(4).view(4, 1, 4, 1)
    empty = eye[:0]
    batch = SemiBatch(eye, torch.tensor([0, 1, 2, 0]), 4, empty, empty)
    expected = nn.functional.cross_entropy(model(eye), batch.labels)
    assert torch.equal(FixMatch(FixMatchSettings()).loss(model, batch), expected)


def test_semi_batches_add_mu_unlabelled_images_per_labelled_one_and_keep_the_labelled_draws():
    from fedcli.data.tensor_source import TensorSource
    from fedcli.training.fixmatch import SemiBatches
    from fedcli.training.local import Batches, LocalSettings
    from fedcli.core.rng import torch_stream

    generator = torch.Generator().manual_seed(0)
    labelled = TensorSource(torch.randint(0, 256, (10, 1, 8, 8), generator=generator, dtype=torch.uint8),
                            torch.arange(10) % 3)
    unlabelled = TensorSource(torch.randint(0, 256, (25, 1, 8, 8), generator=generator, dtype=torch.uint8),
                              torch.full((25,), -1))
    settings = LocalSettings(epochs=2, lr=0.1, batch=4)
    plain = list(Batches(labelled, None, settings, torch_stream(0, "n", 1, "local-train")))
    semi = list(SemiBatches(Batches(labelled, None, settings, torch_stream(0, "n", 1, "local-train")), unlabelled, 3,
                            (), torch_stream(0, "n", 1, "fixmatch"), settings))
    assert len(semi) == len(plain) == 6
    for a, b in zip(plain, semi):
        assert torch.equal(a.x, b.x) and torch.equal(a.labels, b.labels)  # the supervised run's batches
        assert len(b.weak) == len(b.strong) == 3 * b.n_primary
    empty = TensorSource(unlabelled.images[:0], unlabelled.labels[:0])
    none = list(SemiBatches(Batches(labelled, None, settings, torch_stream(0, "n", 1, "local-train")), empty, 3, (),
                            torch_stream(0, "n", 1, "fixmatch"), settings))
    assert all(len(b.weak) == 0 for b in none)


def test_a_node_without_labels_takes_unlabelled_batches_alone_and_the_unlabelled_term_alone():
    """FedPerl's scenarios 2 and 4: mu B unlabelled images a step, the upper bound's ceil(n_u / B) steps an epoch
    (or --steps-per-round), and a loss without a supervised part (no NaN from an empty cross-entropy)."""
    import dataclasses

    from fedcli.data.tensor_source import TensorSource
    from fedcli.training.fixmatch import SemiBatches
    from fedcli.training.local import Batches, LocalSettings
    from fedcli.core.rng import torch_stream

    generator = torch.Generator().manual_seed(0)
    unlabelled = TensorSource(torch.randint(0, 256, (25, 1, 8, 8), generator=generator, dtype=torch.uint8),
                              torch.full((25,), -1))
    nothing = TensorSource(unlabelled.images[:0], torch.zeros(0, dtype=torch.int64))
    settings = LocalSettings(epochs=2, lr=0.1, batch=4)
    for given, steps in ((settings, 2 * 7), (dataclasses.replace(settings, steps_per_round=5), 2 * 5)):  # ceil(25/4)
        batches = list(SemiBatches(Batches(nothing, None, given, torch_stream(0, "n", 1, "local-train")), unlabelled,
                                   3, (), torch_stream(0, "n", 1, "fixmatch"), given))
        assert len(batches) == steps and all(len(b.x) == 0 and len(b.weak) == len(b.strong) == 12 for b in batches)
    model = Table(3 * torch.randn(64, 3, generator=generator))
    batch = batches[0]
    loss = FixMatch(FixMatchSettings(confidence=0.5)).loss(model, batch)
    weak, strong = model(batch.weak), model(batch.strong)
    confidence, pseudo = torch.softmax(weak, 1).max(1)
    expected = (nn.functional.cross_entropy(strong, pseudo, reduction="none") * (confidence >= 0.5)).mean()
    assert torch.isfinite(loss) and torch.allclose(loss, expected)
