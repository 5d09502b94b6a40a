"""Reconstruction attacks: model inversion rebuilds an image from its features where the encoder provably keeps
it (an injective conv stem) and learns nothing from a constant encoder; a fully connected layer's gradients give
its single input exactly, and gradient matching finds it; the scores say "reconstructed" only when a
reconstruction is closer to its original than to every other real image."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from skimage.metrics import peak_signal_noise_ratio
from sklearn.datasets import load_digits
from torch import nn

from fedcli.audit import inversion, scores
from fedcli.core.rng import torch_stream

SETTINGS = inversion.InversionSettings(iterations=300, restarts=1, lr=0.05, tv=0.0)


@pytest.fixture(scope="module")
def digits() -> torch.Tensor:
    """Real 8x8 digits in [-1, 1], one channel: 4 to attack, then 40 others."""
    images = load_digits().images[:44] / 8 - 1
    return torch.tensor(images, dtype=torch.float32).unsqueeze(1)


class Pixels:
    """A stand-in for LPIPS: the RMS pixel distance, so the scores' logic is tested apart from a network."""

    def features_of(self, images, chunk=256):
        return images

    def features(self, images):
        return images

    def pairwise(self, a, b):
        return scores.pixel_l2(a.repeat_interleave(len(b), 0), b.repeat(len(a), 1, 1, 1)).view(len(a), len(b))

    def paired(self, a, b):
        return scores.pixel_l2(a, b)


def streams(n: int) -> list[torch.Generator]:
    return [torch_stream(0, "test-inversion", i) for i in range(n)]


def test_an_injective_conv_stem_gives_its_images_back(digits):
    torch.manual_seed(0)
    stem = nn.Conv2d(1, 8, 3, padding=1)  # a linear map onto 8x the pixels: generically injective
    targets, others = digits[:4], digits[4:]
    with torch.no_grad():
        features = stem(targets)
    rebuilt = inversion.invert_features(stem, features, (1, 8, 8), SETTINGS, streams(4))
    scored = scores.reconstruction_scores(Pixels(), rebuilt, targets, others)
    assert bool(scored["reconstructed_psnr"].all() and scored["reconstructed_ssim"].all())
    assert bool(scored["reconstructed_lpips"].all())
    assert float(scored["psnr"].min()) > 30


def test_a_constant_encoder_gives_nothing_away(digits):
    class Constant(nn.Module):
        def forward(self, x):
            return 0 * x.flatten(1)[:, :4] + 1

    targets, others = digits[:4], digits[4:]
    rebuilt = inversion.invert_features(Constant(), torch.ones(4, 4), (1, 8, 8), SETTINGS, streams(4))
    starts = torch.stack([inversion.start_images((1, 8, 8), s) for s in streams(4)])
    assert torch.equal(rebuilt, starts.clamp(-1, 1))  # no gradient ever moved them
    scored = scores.reconstruction_scores(Pixels(), rebuilt, targets, others)
    assert float(scored["psnr"].max()) < 10
    for score in ("psnr", "ssim"):  # no nearer its own original than the best of 40 others, as for any noise
        assert float(scored[score].mean()) < float(scored[f"{score}_nearest_other"].mean())
    assert float(scored["lpips"].mean()) > float(scored["lpips_nearest_other"].mean())


def test_a_fully_connected_layer_gives_its_single_input_exactly(digits):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 10))
    image, label = digits[:1], torch.tensor([3])
    weight_gradient, bias_gradient = inversion.batch_gradient(model, image, label)
    assert torch.allclose(inversion.linear_layer_input(weight_gradient, bias_gradient), image.flatten(), atol=1e-5)
    assert inversion.labels_from_bias_gradient(bias_gradient).tolist() == [3]
    with pytest.raises(ValueError, match="bias gradient is zero"):
        inversion.linear_layer_input(weight_gradient, torch.zeros_like(bias_gradient))


def test_gradient_matching_finds_a_single_image_and_leaves_the_model_as_it_was(digits):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 10))
    before = [p.detach().clone() for p in model.parameters()]
    image, label = digits[:1], torch.tensor([3])
    observed = inversion.batch_gradient(model, image, label)
    rebuilt = inversion.invert_gradient(model, observed, label, (1, 8, 8), SETTINGS, torch_stream(0, "test"))
    cosine = torch.nn.functional.cosine_similarity(rebuilt.flatten(), image.flatten(), dim=0)
    assert float(cosine) > 0.95  # a linear layer's gradient fixes the image up to its scale
    assert float(inversion.gradient_mismatch(observed, inversion.batch_gradient(model, rebuilt, label))) < 1e-3
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_psnr_and_total_variation_as_a_hand_computation(digits):
    a, b = digits[:3], digits[3:6]
    expected = [peak_signal_noise_ratio(x.numpy(), y.numpy(), data_range=2) for x, y in zip(a, b)]
    assert np.allclose(scores.psnr(a, b).numpy(), expected, atol=1e-4)
    x = torch.tensor([[[[0.0, 1.0], [3.0, 1.0]]]])
    assert float(inversion.total_variation(x)) == pytest.approx((3 + 0) / 2 + (1 + 2) / 2)
