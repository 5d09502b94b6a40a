"""The buffer fidelity score: it must rank real images, noise and a leak correctly, with no pretrained net;
and FID on both its feature spaces, against torch-fidelity and the closed form of two Gaussians."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from sklearn.datasets import load_digits

from fedcli.core import weights
from fedcli.core.errors import UserError
from fedcli.data.dataset import NodeDataset, to_float
from fedcli.data.tensor_source import TensorSource
from fedcli.generators import fid, fidelity, node_training
from fedcli.generators.config import GanConfig
from fedcli.generators.registry import generator_kind
from fedcli.generators.fidelity import Budget, score, train_classifier, within
from fedcli.generators.vqvae2.kind import FIDELITY_SHARE, KIND as VQVAE2

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


FULL = Budget()  # train-gan's defaults: 3 seeds of 11 epochs


def test_a_budget_within_its_allowance_is_kept_whole():
    assert within(FULL, 3 * 2 * 11 * 17, 539, 1) == FULL  # seeds x (real + buffer) x epochs x ceil(539 / 32)


def test_over_its_allowance_the_score_drops_seeds_first_then_epochs_down_to_one_of_each():
    assert within(FULL, 800, 539, 1) == dataclasses.replace(FULL, seeds=2)  # 2 x 2 x 187 = 748 steps
    assert within(FULL, 200, 539, 1) == dataclasses.replace(FULL, seeds=1, epochs=5)  # 2 x 5 x 17 = 170
    assert within(FULL, 1, 539, 1) == dataclasses.replace(FULL, seeds=1, epochs=1)


@pytest.mark.parametrize("images", [40, 539, 5000])
@pytest.mark.parametrize("prior_iterations", [0, 200], ids=["decoded-codes", "prior"])
def test_a_vqvae2_score_takes_at_most_half_its_generators_steps_in_whole_epochs_of_the_nodes_images(
        images, prior_iterations):
    """The rule (docs/train-gan.md): the classifiers' steps in all are at most FIDELITY_SHARE x the node's
    generator steps, as many whole epochs of the node's images as fit (one seed of one epoch at least), so the
    epochs fall as the node's images grow and the score's cost stays bounded by the generator's."""
    assert FIDELITY_SHARE == 0.5
    cfg = GanConfig(exp=Path("exp"), generator="vqvae2", iterations=400, prior_iterations=prior_iterations)
    buffers = 2 if prior_iterations else 1  # with a prior, the decoded codes are scored beside its samples
    budget = VQVAE2.fidelity_budget(cfg, FULL, images, buffers)
    allowance, per_epoch = (400 + prior_iterations) // 2, (1 + buffers) * math.ceil(images / FULL.batch)
    total = budget.seeds * budget.epochs * per_epoch
    assert total <= allowance or (budget.seeds, budget.epochs) == (1, 1)
    fitting_epochs = min(FULL.epochs, max(1, allowance // per_epoch))
    assert budget.seeds == FULL.seeds or (budget.seeds, budget.epochs) == (1, fitting_epochs)
    assert dataclasses.replace(budget, seeds=FULL.seeds, epochs=FULL.epochs) == FULL  # model, lr, batch kept


def test_a_vqvae2_score_trains_the_steps_its_budget_states(digits, monkeypatch):
    """Counted where the classifiers train (each one's batches, untrained: only their number matters here): 400
    digits (13 steps an epoch) and a 120-step generator leave 60 steps, one seed of 2 epochs on each side."""
    train, test = digits
    steps = []
    monkeypatch.setattr(fidelity, "train_local", lambda model, batches, *args: steps.append(len(batches)) or steps[-1])
    budget = VQVAE2.fidelity_budget(GanConfig(exp=Path("exp"), generator="vqvae2", iterations=120), FULL,
                                    len(train), 1)
    result = score({"released": train}, train, test, budget, in_channels=1, num_classes=10, seed=0, node="node0")
    assert (budget.seeds, budget.epochs) == (1, 2) and steps == [26, 26] and result["released"]["steps"] == 26


@pytest.mark.parametrize("kind", ["vqvae2", "stylegan2"])
def test_train_gan_scores_a_vqvae2_node_within_the_rule_and_a_stylegan2_node_in_full(kind, digits_manifest,
                                                                                      monkeypatch):
    """Through train-gan's measure_fidelity (each classifier's training stubbed to its count of steps): config.json
    records the budget that trained; a stylegan2 node has no cap, so the quickstart's scores stay as they were."""
    steps = []
    monkeypatch.setattr(fidelity, "train_local", lambda model, batches, *args: steps.append(len(batches)) or steps[-1])
    data = NodeDataset(digits_manifest, "node0", "train")
    train = TensorSource(data.images, data.labels)
    cfg = GanConfig(exp=Path("exp"), generator=kind)
    full = fidelity.config_budget(cfg, digits_manifest)
    expected = VQVAE2.fidelity_budget(cfg, full, len(train), 1) if kind == "vqvae2" else full
    record = node_training.measure_fidelity(cfg, digits_manifest, generator_kind(kind), "node0", 0,
                                            sorted(set(data.labels.tolist())), {}, train, train, "cpu")
    assert record["classifier"] == dataclasses.asdict(expected) and len(steps) == 2 * expected.seeds
    assert sum(steps) <= cfg.iterations // 2 if kind == "vqvae2" else expected == full


def test_offline_fid_space_is_a_classifier_of_the_nodes_images_and_sees_missing_classes(digits):
    """The Inception-free FID: identical sets at 0, held-out real images close, a generator that lost 8 of 10
    classes far."""
    train, test = digits
    classifier, _ = train_classifier(train, BUDGET, len(train), 1, 10, (0, "node0", "fid-features"))
    space = fid.classifier_space(classifier)
    assert (space.name, space.calibrated) == ("cnn-node", False)
    frechet = fid.Frechet(space.embed(to_float(train.images)), space.calibrated)

    def distance(images: torch.Tensor) -> float:
        return frechet.distance(space.embed(to_float(images)))

    two_classes = train.images[train.labels < 2]
    noise = torch.randint(0, 256, (150, 1, 8, 8), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    held_out, collapsed, random = distance(test.images), distance(two_classes), distance(noise)
    assert held_out < collapsed / 3 and held_out < random / 3
    assert distance(train.images) == pytest.approx(0, abs=1e-6) and held_out > 1e-3


def images(n: int, key: int) -> torch.Tensor:
    """`n` random grey 16x16 images in [-1, 1], on uint8 levels."""
    generator = torch.Generator().manual_seed(key)
    return to_float(torch.randint(0, 256, (n, 1, 16, 16), dtype=torch.uint8, generator=generator))


@pytest.fixture(scope="module")
def tf_inception_file(tmp_path_factory) -> Path:
    """torch-fidelity's Inception-v3, randomly initialised (He-scaled convolutions from a keyed generator,
    BatchNorm at identity), saved as a state dict as `fedcli weights fetch inception` leaves it: no download."""
    from torch_fidelity import feature_extractor_inceptionv3 as tf

    with pytest.MonkeyPatch.context() as patch, torch.device("meta"):  # the network's shapes, no weights
        patch.setattr(tf, "load_state_dict_from_url", lambda *args, **kwargs: {})
        patch.setattr(tf.FeatureExtractorInceptionV3, "load_state_dict", lambda self, state: None)
        shapes = {key: value.shape for key, value in
                  tf.FeatureExtractorInceptionV3(fid.TF_INCEPTION, ["2048"]).state_dict().items()}
    generator = torch.Generator().manual_seed(0)
    state = {}
    for key, shape in shapes.items():
        if key.endswith("conv.weight") or key == "fc.weight":
            state[key] = torch.randn(shape, generator=generator) * (2 / shape[1:].numel()) ** 0.5
        elif key.endswith("num_batches_tracked"):
            state[key] = torch.zeros(shape, dtype=torch.long)
        else:  # BatchNorm's scale and running variance 1, its shift and running mean 0, fc's bias 0
            state[key] = torch.ones(shape) if key.endswith(("bn.weight", "running_var")) else torch.zeros(shape)
    path = tmp_path_factory.mktemp("hub") / weights.BACKBONES["inception"].filename
    torch.save(state, path)
    return path


def test_calibrated_fid_is_torch_fidelitys_tf_inception_and_zero_between_identical_sets(tf_inception_file):
    """The calibrated path reads torch-fidelity's network from the weights file and gives the features
    torch-fidelity gives uint8 RGB images (TensorFlow's resize); identical sets 0, a shifted copy ||shift||^2."""
    from torch_fidelity.feature_extractor_inceptionv3 import FeatureExtractorInceptionV3

    space = fid.inception_space(tf_inception_file)
    assert (space.name, space.calibrated) == ("inception-v3-compat", True)
    grey = images(2, 0)
    features = space.embed(grey)
    reference = FeatureExtractorInceptionV3("reference", ["2048"],
                                            feature_extractor_weights_path=str(tf_inception_file))
    rgb = ((grey[:1] + 1) * 127.5).round().to(torch.uint8).expand(-1, 3, -1, -1)
    assert features.shape == (2, 2048) and torch.allclose(features[:1], reference(rgb)[0], rtol=1e-5, atol=1e-7)
    assert features.var(dim=0).sum() > 1e-2  # the two images' features differ: a zero that could fail
    frechet = fid.Frechet(features, calibrated=True)
    assert frechet.distance(features) == pytest.approx(0, abs=1e-6)
    assert frechet.distance(features.double() + 0.1) == pytest.approx(2048 * 0.1 ** 2, rel=1e-9)


def test_a_weights_file_that_is_not_torch_fidelitys_inception_is_one_line(tmp_path):
    path = tmp_path / "inception_v3_google-0cc3c7bd.pth"
    torch.save({"Conv2d_1a_3x3.conv.weight": torch.ones(32, 3, 3, 3)}, path)
    with pytest.raises(UserError, match="not torch-fidelity's TF-ported Inception-v3.*fedcli weights fetch inception"):
        fid.inception_space(path)


def scatter(n: int, d: int, rank: int, generator: torch.Generator) -> torch.Tensor:
    """(n, d) with zero column means and Z^T Z = (n - 1) on the first `rank` coordinates, 0 beyond: the
    columns of a QR orthogonal to the constant one."""
    basis, _ = torch.linalg.qr(torch.cat([torch.ones(n, 1, dtype=torch.float64),
                                          torch.randn(n, rank, generator=generator, dtype=torch.float64)], dim=1))
    z = torch.zeros(n, d, dtype=torch.float64)
    z[:, :rank] = basis[:, 1:] * (n - 1) ** 0.5
    return z


@pytest.mark.parametrize("n", [200, 12], ids=["more-images-than-features", "fewer"])
@pytest.mark.parametrize("calibrated", [True, False], ids=["calibrated", "fallback"])
def test_frechet_distance_of_two_gaussians_is_the_closed_form_and_torch_fidelitys(calibrated, n):
    """Feature sets whose sample means and covariances are exactly two Gaussians' (diagonal, then both turned
    by one rotation, which leaves the distance alone): ||mu1 - mu2||^2 + sum (sqrt(s1) - sqrt(s2))^2, on the
    calibrated path as it is, on the fallback in units of the real features' spread (their mean variance);
    torch-fidelity's FID (as torchmetrics', from the eigenvalues of S1 S2) gives the same number. With fewer
    images than features the Gaussians have rank n - 1."""
    from torch_fidelity.metric_fid import KEY_METRIC_FID, fid_features_to_statistics, fid_statistics_to_metric

    d, rank = 24, min(24, n - 1)
    generator = torch.Generator().manual_seed(n)
    mu1, mu2 = (torch.randn(d, generator=generator, dtype=torch.float64) for _ in range(2))
    s1, s2 = (torch.rand(d, generator=generator, dtype=torch.float64) * 4 + 0.1 for _ in range(2))
    s1[rank:], s2[rank:] = 0, 0
    rotation, _ = torch.linalg.qr(torch.randn(d, d, generator=generator, dtype=torch.float64))
    real = (mu1 + scatter(n, d, rank, generator) * s1.sqrt()) @ rotation
    fake = (mu2 + scatter(n, d, rank, generator) * s2.sqrt()) @ rotation
    closed_form = float((mu1 - mu2).square().sum() + (s1.sqrt() - s2.sqrt()).square().sum())
    expected = closed_form if calibrated else closed_form / float(s1.mean())
    assert fid.Frechet(real, calibrated).distance(fake) == pytest.approx(expected, rel=1e-9)
    assert fid.Frechet(real, calibrated).distance(real) == pytest.approx(0, abs=1e-6)
    reference = fid_statistics_to_metric(*(fid_features_to_statistics(x) for x in (real, fake)), verbose=False)
    assert reference[KEY_METRIC_FID] == pytest.approx(closed_form, rel=1e-6)
