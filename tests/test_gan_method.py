"""The GAN method itself: privacy loss, demodulation, ADA, R1, phases, and the privacy effect."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from fedcli.audit import effects
from fedcli.core.devices import torch_threads
from fedcli.data.sources.digits import load_digit_images
from fedcli.generators import losses
from fedcli.generators.fid import FeatureSpace
from fedcli.generators.perceptual import Perceptual
from fedcli.generators.stylegan2 import ada
from fedcli.generators.stylegan2.networks import Architecture, Generator, modulated_conv2d
from fedcli.generators.stylegan2.train import GanTrainer, TrainSettings, run_phases

PIXELS = FeatureSpace(lambda images: F.avg_pool2d(images, 4).flatten(1), "pixels", False)  # cheap FID space


@pytest.fixture(scope="module")
def perceptual() -> Perceptual:
    return Perceptual("alex")


def tiny_arch(classes: int = 2, resolution: int = 16) -> Architecture:
    return Architecture(resolution=resolution, channels=1, num_classes=classes, z_dim=16, w_dim=16,
                        channel_base=128, channel_max=16)


def digit_images(n: int, size: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    images, labels = load_digit_images()
    x = F.interpolate(torch.from_numpy(images[:n]).unsqueeze(1), size=size, mode="bilinear", align_corners=False)
    return x * 2 - 1, torch.from_numpy(labels[:n])


def test_privacy_loss_sums_lpips_over_all_pairs_like_a_brute_force_loop(perceptual):
    reals, _ = digit_images(6, 32)
    fakes = torch.rand(6, 1, 32, 32) * 2 - 1
    l_pp, mean = losses.privacy_loss(perceptual, reals, fakes)
    rgb = lambda t: t.expand(-1, 3, -1, -1)  # noqa: E731
    brute = sum(perceptual.model(rgb(reals[i:i + 1]), rgb(fakes[j:j + 1])).item() for i in range(6) for j in range(6))
    assert l_pp.item() == pytest.approx(brute / 6, rel=1e-5)
    assert mean.item() == pytest.approx(brute / 36, rel=1e-5)


def test_nearest_privacy_loss_sums_each_fakes_distance_to_its_nearest_real(perceptual):
    reals, _ = digit_images(7, 32)
    fakes = torch.cat([reals[:2] + 0.01, torch.rand(3, 1, 32, 32) * 2 - 1]).requires_grad_(True)
    l_pp, mean = losses.nearest_privacy_loss(perceptual, perceptual.features(reals), fakes)
    rgb = lambda t: t.expand(-1, 3, -1, -1)  # noqa: E731
    brute = [min(perceptual.model(rgb(r[None]), rgb(f[None].detach())).item() for r in reals) for f in fakes]
    assert l_pp.item() == pytest.approx(sum(brute), rel=1e-5) and mean.item() == pytest.approx(sum(brute) / 5, rel=1e-5)
    assert brute[0] < 0.1 * brute[2]  # a near copy of a real image is nearest to it
    # a step up the loss moves the near copies away from the real images they copy
    (grad,) = torch.autograd.grad(l_pp, fakes)
    moved = (fakes + 0.05 * grad.sign()).detach()
    after, _ = losses.nearest_privacy_loss(perceptual, perceptual.features(reals), moved[:2])
    assert after.item() > sum(brute[:2])


def test_privacy_loss_gradient_reaches_the_generator_only(perceptual):
    torch.manual_seed(0)
    generator = Generator(tiny_arch())
    reals = (torch.rand(4, 1, 16, 16) * 2 - 1).requires_grad_(True)
    fakes = generator(torch.randn(4, 16), torch.tensor([0, 1, 0, 1]))
    l_pp, _ = losses.privacy_loss(perceptual, reals, fakes)
    (-l_pp).backward()
    assert reals.grad is None
    assert all(p.grad is None for p in perceptual.parameters())
    grads = [p.grad for p in generator.parameters() if p.requires_grad]
    assert sum(g is not None and g.abs().sum() > 0 for g in grads) > len(grads) // 2


def test_demodulated_convolution_keeps_unit_variance():
    torch.manual_seed(0)
    x = torch.randn(64, 32, 16, 16)
    weight = torch.randn(48, 32, 3, 3)
    styles = torch.rand(64, 32) * 3 + 0.1
    out = modulated_conv2d(x, weight, styles)
    assert out[..., 1:-1, 1:-1].var().item() == pytest.approx(1.0, abs=0.05)
    # the non-fused form equals explicit per-sample modulated, demodulated weights
    w = weight[None] * styles[:, None, :, None, None]
    w = w / w.square().sum(dim=(2, 3, 4), keepdim=True).add(1e-8).sqrt()
    explicit = torch.stack([F.conv2d(x[i:i + 1], w[i], padding=1)[0] for i in range(4)])
    assert torch.allclose(out[:4], explicit, atol=1e-4)


def test_ada_probability_follows_the_sign_of_d_on_reals():
    controller = ada.AdaptiveAugment(target=0.6, speed_kimg=1.0, interval=4)
    for _ in range(4):
        controller.observe(torch.full((32,), 2.0))  # sign mean 1 > 0.6: D over-fits
    assert controller.p == pytest.approx(4 * 32 / 1000)
    raised = controller.p
    for _ in range(4):
        controller.observe(torch.tensor([1.0, -1.0] * 16))  # sign mean 0 < 0.6
    assert controller.p < raised
    for _ in range(40):
        controller.observe(torch.full((32,), -1.0))
    assert controller.p == 0.0


def test_augmentation_is_identity_at_p0_and_differentiable():
    x = torch.randn(8, 1, 16, 16, requires_grad=True)
    generator = torch.Generator().manual_seed(0)
    assert ada.augment(x, 0.0, generator) is x
    y = ada.augment(x, 1.0, generator)
    assert y.shape == x.shape and not torch.equal(y, x)
    y.square().sum().backward()
    assert x.grad is not None and x.grad.abs().sum() > 0


def test_integer_translation_moves_pixels():
    x = torch.zeros(1, 1, 8, 8)
    x[0, 0, 3, 3] = 1
    moved = ada.translate(x, torch.tensor([[1, -2]]))
    assert moved[0, 0, 4, 1] == 1 and moved.sum() == 1


def test_the_nearest_form_is_the_distance_to_the_closest_of_all_reals_not_the_batch_mean(perceptual):
    """Same seeds, same first step: each fake's distance to its nearest real training image is at most
    its mean distance to the batch's reals, so the nearest form's L_PP is the smaller one."""
    images, labels = digit_images(32)
    base = dict(batch=8, iterations=1, fid_every=1, fid_images=16)
    l_pp = {}
    for form in ("all-pairs", "nearest"):
        trainer = make_trainer(perceptual, TrainSettings(privacy_loss=form, **base), images, labels % 2, tiny_arch())
        l_pp[form] = trainer.step(alpha=1.0)["l_pp"]
    assert trainer.real_lpips[0].shape[0] == 32  # every real training image, not the batch
    assert 0 < l_pp["nearest"] < l_pp["all-pairs"]


def test_the_relative_scale_divides_l_pp_by_the_nodes_own_real_to_real_distance(perceptual):
    """The reference is the mean distance between two different real images (all-pairs) or from each to its
    nearest other (nearest), and training at alpha under the relative scale is training at alpha / reference
    under the absolute one."""
    images, labels = digit_images(32)
    features = perceptual.features_of(images)
    distances = perceptual.pairwise(features, features).double()
    off = ~torch.eye(32, dtype=torch.bool)
    assert losses.real_reference(perceptual, features, "all-pairs") == pytest.approx(float(distances[off].mean()))
    nearest = distances.masked_fill(~off, math.inf).min(dim=1).values.mean()
    assert losses.real_reference(perceptual, features, "nearest") == pytest.approx(float(nearest))
    base = dict(batch=8, iterations=1, fid_every=1, fid_images=32)
    relative = make_trainer(perceptual, TrainSettings(privacy_scale="relative", **base), images, labels % 2,
                            tiny_arch())
    absolute = make_trainer(perceptual, TrainSettings(**base), images, labels % 2, tiny_arch())
    assert relative.privacy_reference == pytest.approx(float(distances[off].mean()), rel=1e-5)
    assert absolute.privacy_reference == 1.0
    relative.step(alpha=1.0), absolute.step(alpha=1.0 / relative.privacy_reference)
    for a, b in zip(relative.G.parameters(), absolute.G.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_r1_penalty_matches_a_hand_computation():
    a = torch.tensor(0.7)

    def discriminator(x, labels):  # D(x) = sum(a x^2): grad = 2 a x
        return (a * x.square()).sum(dim=(1, 2, 3))

    x = torch.randn(5, 1, 4, 4)
    penalty, logits = losses.r1_penalty(discriminator, x, torch.zeros(5, dtype=torch.long))
    assert penalty.item() == pytest.approx((2 * a * x).square().sum(dim=(1, 2, 3)).mean().item(), rel=1e-6)
    assert torch.allclose(logits, discriminator(x, None))


def make_trainer(perceptual, settings, images, labels, arch, seed=0):
    return GanTrainer(arch, settings, images, labels, perceptual, PIXELS,
                      torch.Generator().manual_seed(seed), init_seed=1)


def test_phase_two_with_alpha_zero_continues_phase_one_exactly(perceptual):
    images, labels = digit_images(32)
    labels = labels % 2
    arch = tiny_arch()
    settings = TrainSettings(batch=8, iterations=4, patience=100, pp_iterations=4, fid_every=4, fid_images=16,
                             alpha=0.0, fid_factor=1e9)
    _, phase2, _, _ = run_phases(make_trainer(perceptual, settings, images, labels, arch), lambda row: None)
    plain = make_trainer(perceptual, settings, images, labels, arch)
    for _ in range(4):
        plain.step(alpha=0.0)
    plain.fid()
    for _ in range(4):
        plain.step(alpha=0.0)
    assert all(torch.equal(phase2.generator[k], v) for k, v in plain.G_ema.state_dict().items())


def test_the_control_repeats_phase_two_without_the_privacy_loss(perceptual):
    """Same snapshot, iterations, data order and draws: at alpha = 0 the control is the privacy generator
    bit for bit; at alpha > 0 the privacy loss is all that separates them."""
    images, labels = digit_images(32)
    labels = labels % 2
    arch = tiny_arch()
    base = dict(batch=8, iterations=6, patience=100, pp_iterations=5, fid_every=2, fid_images=16, fid_factor=1e9)
    results = {}
    for alpha in (0.0, 2.0):
        rows = []
        settings = TrainSettings(alpha=alpha, **base)
        results[alpha] = run_phases(make_trainer(perceptual, settings, images, labels, arch), rows.append)
        phase1, privacy, control, _ = results[alpha]
        assert control.iteration == privacy.iteration == 5 and control.iterations_run == 5
        assert [r["iteration"] for r in rows if r["phase"] == "control"] == [1, 2, 3, 4, 5]
        same = all(torch.equal(privacy.generator[k], v) for k, v in control.generator.items())
        assert same == (alpha == 0.0)
    # the control does not depend on the privacy run's alpha
    assert all(torch.equal(results[0.0][2].generator[k], v) for k, v in results[2.0][2].generator.items())


def test_a_reseeded_control_is_another_alpha_zero_continuation_and_changes_nothing_else(perceptual):
    images, labels = digit_images(32)
    arch = tiny_arch()
    settings = TrainSettings(batch=8, iterations=4, patience=100, pp_iterations=4, fid_every=2, fid_images=16,
                             fid_factor=1e9, alpha=1.0)
    rows = []
    plain = run_phases(make_trainer(perceptual, settings, images, labels % 2, arch), lambda row: None)
    both = run_phases(make_trainer(perceptual, settings, images, labels % 2, arch), rows.append, reseed=7)
    assert plain.reseeded is None
    for a, b in zip(plain[:3], both[:3]):  # asking for the reseeded control leaves the released three alone
        assert all(torch.equal(a.generator[k], v) for k, v in b.generator.items())
    assert both.reseeded.iteration == both.control.iteration == 4
    assert [r["iteration"] for r in rows if r["phase"] == "reseeded"] == [1, 2, 3, 4]
    assert not all(torch.equal(both.control.generator[k], v) for k, v in both.reseeded.generator.items())


def test_the_control_of_an_unkept_privacy_phase_is_the_standard_generator(perceptual):
    images, labels = digit_images(32)
    arch = tiny_arch()
    settings = TrainSettings(batch=8, iterations=4, patience=100, pp_iterations=4, fid_every=2, fid_images=16,
                             fid_factor=1e-9, alpha=1.0)  # the first phase-2 FID exceeds the factor
    phase1, privacy, control, _ = run_phases(make_trainer(perceptual, settings, images, labels % 2, arch),
                                          lambda row: None)
    assert privacy.iteration == control.iteration == 0
    assert all(torch.equal(phase1.generator[k], v) for k, v in control.generator.items())


def nearest_real(perceptual, generator_state, arch, reals) -> tuple[torch.Tensor, torch.Tensor]:
    """Per sample (the same 64 latents for every generator): LPIPS and pixel distance to the nearest real."""
    generator = Generator(arch)
    generator.load_state_dict(generator_state)
    with torch.no_grad():
        fakes = generator(torch.randn(64, arch.z_dim, generator=torch.Generator().manual_seed(1)),
                          torch.zeros(64, dtype=torch.long), generator=torch.Generator().manual_seed(2)).clamp(-1, 1)
        lpips = perceptual.pairwise(perceptual.features(fakes), perceptual.features(reals)).min(dim=1).values
        pixel = torch.cdist(fakes.flatten(1), reals.flatten(1)).min(dim=1).values
    return lpips, pixel


def test_privacy_phase_moves_samples_away_from_memorisable_reals(perceptual):
    """16 images of one class at 16x16: small enough to memorise. Against its control (the same phase 2
    at alpha 0), the privacy phase must push the samples' nearest-real distance up in LPIPS and in
    pixels, keeping FID within the factor."""
    images, _ = digit_images(16)
    labels = torch.zeros(16, dtype=torch.long)
    arch = Architecture(resolution=16, channels=1, num_classes=1, z_dim=32, w_dim=32, channel_base=256,
                        channel_max=32)
    settings = TrainSettings(batch=16, iterations=600, patience=10 ** 6, pp_iterations=150, fid_every=25,
                             fid_images=64, alpha=3.0, ada_target=1.0, r1_gamma=0.01, ema_kimg=0.1)
    with torch_threads(1):
        phase1, phase2, control, _ = run_phases(make_trainer(perceptual, settings, images, labels, arch),
                                             lambda row: None)
    assert phase2.iteration > 0, "the privacy phase kept no snapshot"
    assert phase2.fid <= settings.fid_factor * phase1.fid
    lpips_control, pixel_control = nearest_real(perceptual, control.generator, arch, images)
    lpips2, pixel2 = nearest_real(perceptual, phase2.generator, arch, images)
    # The same latent's sample moves away under the privacy loss, in LPIPS and in pixels, for most latents
    # (one-sided signed-rank p < 0.01). Its size here is about 1.08x in LPIPS and 1.05x in pixels: a
    # member-protecting effect of 1.1x or more is issue 14's open design work, not this test's to assume.
    for privacy, control_ in ((lpips2, lpips_control), (pixel2, pixel_control)):
        assert effects.wilcoxon_greater(privacy.numpy(), control_.numpy()) < 0.01, (privacy.mean(), control_.mean())
        assert privacy.median() > control_.median()
    assert math.isfinite(phase1.fid)


@pytest.mark.parametrize("resolution,batch,gamma", [(16, 32, 0.0016), (32, 32, 0.0064), (256, 32, 0.4096),
                                                    (64, 8, 0.1024)])
def test_r1_gamma_auto_is_the_stylegan2_ada_heuristic(tmp_path, resolution, batch, gamma):
    from fedcli.generators.config import GanConfig
    from fedcli.generators.stylegan2.kind import settings

    resolved = settings(GanConfig(exp=tmp_path, r1_gamma="auto", batch=batch), resolution)
    assert resolved.r1_gamma == pytest.approx(gamma, rel=1e-12)
    assert settings(GanConfig(exp=tmp_path, r1_gamma=0.05, batch=batch), resolution).r1_gamma == 0.05


def test_truncation_zero_gives_the_class_mean_w_and_one_leaves_w_alone():
    generator = Generator(tiny_arch(classes=3)).eval()
    z = torch.randn(6, 16, generator=torch.Generator().manual_seed(0))
    labels = torch.tensor([0, 1, 2, 0, 1, 2])
    generator.track_w_avg(generator.mapping(z, labels), labels)  # a first update: the batch's class means
    w = generator.mapping(z, labels)
    means = torch.stack([w[labels == c].mean(dim=0) for c in range(3)])
    assert torch.allclose(generator.w_avg, means, atol=1e-6)
    assert torch.allclose(generator.styles(z, labels, truncation=0.0), means[labels], atol=1e-6)
    assert torch.equal(generator.styles(z, labels, truncation=1.0), w)
    half = generator.styles(z, labels, truncation=0.5)
    assert torch.allclose(half, (w + means[labels]) / 2, atol=1e-6)


def test_training_tracks_each_class_mean_w_and_mixes_styles(perceptual):
    """w_avg follows the mapping's outputs per class; style mixing at probability 1 feeds two ws."""
    reals, labels = digit_images(64)
    labels = labels % 2
    fed = []
    trainer = GanTrainer(tiny_arch(), TrainSettings(batch=8, style_mixing=1.0, fid_images=16), reals, labels,
                         perceptual, PIXELS, torch.Generator().manual_seed(0), init_seed=1)
    synthesis = trainer.G.synthesis
    trainer.G.synthesis = lambda w, *a, **k: (fed.append(w.dim()), synthesis(w, *a, **k))[1]
    for _ in range(20):
        trainer.step()
    assert set(fed) == {3}  # every training batch mixed (B, num_ws, w_dim)
    with torch.no_grad():
        z = torch.randn(256, 16, generator=torch.Generator().manual_seed(1))
        for c in (0, 1):
            w = trainer.G.mapping(z, torch.full((256,), c))
            assert (trainer.G.w_avg[c] - w.mean(dim=0)).norm() < 0.5 * (w - w.mean(dim=0)).norm(dim=1).mean()
    assert torch.equal(trainer.G_ema.w_avg, trainer.G.w_avg)
