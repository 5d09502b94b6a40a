"""The buffer fidelity score: it must rank real images, noise and a leak correctly, with no pretrained net."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.datasets import load_digits

from fedcli.errors import UserError
from fedcli.data.tensor_source import TensorSource
from fedcli.data.dataset import to_float
from fedcli.gan import fid
from fedcli.gan.fidelity import Budget, score, train_classifier

BUDGET = Budget(epochs=4, seeds=2)


@pytest.fixture(scope="module")
def digits() -> tuple[TensorSource, TensorSource]:
    """Real 8x8 digits as uint8 (N, 1, 8, 8): 400 training and 150 test images."""
    data = load_digits()
    images = torch.from_numpy((data.images * 255 / 16).round().astype(np.uint8)).unsqueeze(1)
    labels = torch.from_numpy(data.target.astype(np.int64))
    return TensorSource(images[:400], labels[:400]), TensorSource(images[400:550], labels[400:550])


def scored(buffers: dict[str, TensorSource], train: TensorSource, test: TensorSource) -> dict[str, dict]:
    return score(buffers, train, test, BUDGET, in_channels=1, num_classes=10, seed=0, node="node0")


def test_a_generator_returning_the_training_images_scores_the_real_classifier(digits):
    train, test = digits
    result = scored({"copy": train}, train, test)["copy"]
    assert result["real_accuracy"] > 0.6  # the budget trains a classifier, so chance below is a real contrast
    assert result["synthetic_accuracy"] == result["real_accuracy"] and result["ratio"] == 1.0


def test_noise_scores_at_chance(digits):
    train, test = digits
    generator = torch.Generator().manual_seed(0)
    noise = TensorSource(torch.randint(0, 256, (512, 1, 8, 8), dtype=torch.uint8, generator=generator),
                         torch.arange(512) % 10)
    result = scored({"noise": noise}, train, test)["noise"]
    assert result["synthetic_accuracy"] < 0.25 and result["ratio"] < 0.3
    assert result["class_fidelity"] < 0.3  # the real classifier does not read noise as its labels


def test_a_buffer_of_fewer_or_more_images_gets_the_real_classifiers_number_of_steps(digits):
    train, test = digits
    seen = []
    for size in (100, 700):
        picked = torch.arange(size) % len(train)
        buffer = TensorSource(train.images[picked], train.labels[picked])
        seen.append(scored({"b": buffer}, train, test)["b"]["steps"])
    assert seen[0] == seen[1] == BUDGET.epochs * 13  # ceil(400 / 32) steps per epoch over the real images


def test_a_buffer_holding_test_images_is_refused(digits):
    train, test = digits
    leaked = TensorSource(torch.cat([train.images[:50], test.images[:1]]), torch.cat([train.labels[:50],
                                                                                      test.labels[:1]]))
    with pytest.raises(UserError, match="holds 1 of the node's test images"):
        scored({"released": leaked}, train, test)


def test_test_images_that_also_occur_among_the_training_images_are_not_a_leak(digits):
    train, test = digits
    shared = test.images[:5]
    train = TensorSource(torch.cat([train.images, shared]), torch.cat([train.labels, test.labels[:5]]))
    result = scored({"b": TensorSource(shared, test.labels[:5])}, train, test)["b"]
    assert 0 <= result["ratio"]


def test_offline_fid_space_is_a_classifier_of_the_nodes_images_and_sees_missing_classes(digits):
    """The Inception-free FID: held-out real images sit close, a generator that lost 8 of 10 classes far."""
    train, test = digits
    classifier, _ = train_classifier(train, BUDGET, len(train), 1, 10, (0, "node0", "fid-features"))
    space = fid.classifier_space(classifier)
    assert (space.name, space.calibrated) == ("cnn-node", False)

    def distance(images: torch.Tensor) -> float:
        stats = [fid.statistics(space.embed(to_float(x))) for x in (train.images, images)]
        return fid.frechet_distance(*stats)

    two_classes = train.images[train.labels < 2]
    noise = torch.randint(0, 256, (150, 1, 8, 8), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    held_out, collapsed, random = distance(test.images), distance(two_classes), distance(noise)
    assert held_out < collapsed / 3 and held_out < random / 3
